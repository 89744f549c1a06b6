mod common;
mod resume;
mod run;
mod tenants;
mod tools;
