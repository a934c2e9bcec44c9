pub mod http;
pub mod cluster;
