pub mod cluster;
pub mod http;
