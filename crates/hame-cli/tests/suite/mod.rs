mod common;
mod run;
