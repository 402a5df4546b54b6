//! Helpers shared by the integration tests.

#![allow(dead_code)]

pub mod cnf;
pub mod daemon;
pub mod etcd;
pub mod netns;
