pub mod aptsign;
pub mod cluster;
pub mod http;
