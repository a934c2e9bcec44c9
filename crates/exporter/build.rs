//! Generates the kubelet's PodResources gRPC code from the vendored proto
//! (`proto/`) at build time.

use std::env;

fn main() {
    podresources();
}

/// The vendored kubelet proto, relative to [`PROTO_ROOT`].
const PODRESOURCES_PROTO: &str = "k8s.io/kubelet/pkg/apis/podresources/v1/api.proto";
const PROTO_ROOT: &str = "proto";

/// `$OUT_DIR/v1.rs`: the PodResources messages, client and server
/// (src/podresources.rs; the server serves the exporter tests).
/// Parsed by protox, so no system `protoc` is needed.
fn podresources() {
    println!("cargo:rerun-if-changed={PROTO_ROOT}/{PODRESOURCES_PROTO}");
    let fds = protox::compile([PODRESOURCES_PROTO], [PROTO_ROOT])
        .unwrap_or_else(|e| panic!("parsing {PROTO_ROOT}/{PODRESOURCES_PROTO}: {e}"));
    let out = env::var_os("OUT_DIR").expect("cargo sets OUT_DIR");
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .build_transport(false)
        .out_dir(out)
        .compile_fds(fds)
        .unwrap_or_else(|e| panic!("generating the PodResources gRPC code: {e}"));
}
