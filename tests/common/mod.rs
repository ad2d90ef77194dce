#![allow(dead_code)]
pub mod crash;
pub mod durable;
pub mod faults;
pub mod futures;
pub mod group_model;
pub mod groups;
pub mod hot;
pub mod lifecycle;
pub mod log;
pub mod model_hook;
pub mod odd_files;
pub mod retention;
pub mod tail;
pub mod tmpfs;
