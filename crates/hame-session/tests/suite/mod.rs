mod concurrency;
mod helpers;
mod index;
mod log;
mod remote;
mod tools;
