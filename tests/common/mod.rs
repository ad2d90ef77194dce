#![allow(dead_code)]
pub mod crash;
pub mod durable;
pub mod model_hook;
pub mod tmpfs;
