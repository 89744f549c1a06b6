mod common;
mod resume;
mod run;
mod shared;
mod tenants;
mod tools;
