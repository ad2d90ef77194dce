#![allow(dead_code)]
pub mod crash;
