mod common;
mod concurrency;
mod distributed;
