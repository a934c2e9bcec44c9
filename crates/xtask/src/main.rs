//! `cargo xtask`: the project's tooling as code. `scripts/test`,
//! `scripts/e2e` and `.ci/run` are thin entry points into it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Result;
use clap::{Parser, Subcommand};

mod apt;
mod bench;
mod builder_root;
mod cache;
mod cluster;
mod cmd;
mod deadline;
mod e2e;
mod go;
mod images;
mod jail;
mod matrix;
mod node_root;
mod pipeline;
mod pyjson;
mod real_node;
mod stages;
mod static_build;
mod test_data;
mod tools;
mod toolsfile;
mod vm;

#[derive(Parser)]
#[command(
    name = "cargo xtask",
    about = "The project's test, CI and build tooling"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// The test pipeline: lints, tools, unit and integration tests, real
    /// compiles, VM tests and the real node (scripts/test).
    Test,
    /// CI's set-up before the test pipeline (.ci/run): every package, the
    /// toolchain, the cache's disk use.
    CiSetup,
    /// Builds (or finds in the cache) one of the tools the tests run and
    /// prints its path.
    Tool {
        #[arg(value_enum)]
        name: ToolName,
        /// Only a finished build of the k8s binaries; never compile them.
        #[arg(long)]
        cached: bool,
    },
    /// The statically linked release binary; prints its path.
    StaticBuild {
        #[arg(long, default_value = "gpu-driver-installer")]
        bin: String,
        #[arg(value_enum, default_value = "x86-64")]
        arch: static_build::Arch,
    },
    /// The main job end to end, no GPU needed: a builder root, `build` of
    /// NVIDIA's open modules in it, a VM boot of their kernel and `install`
    /// there, every result checked (scripts/e2e).
    E2e {
        /// Where the artifact, its modules and the VM's console go
        /// (default target/e2e).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Prints the cache root.
    CacheRoot,
    /// A Debian builder root (scripts/builder-root): a compiler, the cloud
    /// kernel's headers and Debian's NVIDIA module sources; prints its path.
    BuilderRoot(builder_root::Args),
    /// A real, local Kubernetes control plane: etcd, kube-apiserver,
    /// kube-controller-manager, kube-scheduler and KWOK
    /// (scripts/local-cluster, docs/local-cluster.md).
    Cluster {
        #[command(subcommand)]
        cmd: cluster::Cmd,
    },
    /// Fetches Debian's NVIDIA module sources, kernel headers (as a local
    /// apt repository), libcuda and nvidia-smi for the tests and prints the
    /// directory holding them (scripts/fetch-test-data).
    #[command(alias = "fetch-test-data")]
    TestData,
    /// Assembles an NVIDIA-style .run (a real makeself archive) from a
    /// builder root's module sources and Debian's NVIDIA user space of the
    /// same version; prints its path (scripts/test-runfile).
    TestRunfile { builder_root: PathBuf },
    /// The root disk of the real-node VM (debootstrap, packages,
    /// tools/node); prints its cache directory (scripts/node-root).
    NodeRoot {
        /// Build it even when a fresh one is cached.
        #[arg(long)]
        rebuild: bool,
    },
    /// The build-matrix smoke test (scripts/matrix): real compiles of
    /// Debian's NVIDIA module sources in the builder roots, compared with
    /// docs/matrix-expect.json (exit 1 when a pair differs, 2 on usage).
    Matrix(matrix::Args),
    /// The project's container images: built with buildah into OCI
    /// archives (scripts/build-images), checked in a throwaway containerd
    /// (scripts/check-images).
    Images {
        #[command(subcommand)]
        cmd: images::Cmd,
    },
    /// A real node: a QEMU VM with containerd and a kubelet joins a local
    /// control plane, and the whole chain runs there on the GPU double;
    /// the last stdout line is one JSON object (scripts/real-node,
    /// docs/real-node.md).
    RealNode(real_node::Args),
    /// The benchmarks behind scripts/bench-*: figures side by side with
    /// their targets and ratios.
    Bench {
        #[command(subcommand)]
        cmd: bench::Cmd,
    },
    /// The x86_64 VM test: the static installer loads real modules into
    /// Debian's cloud kernel under QEMU (scripts/vm-test).
    VmTest(vm::X86Args),
    /// The arm64 VM test: an emulated arm64 machine loads a cross-built
    /// arm64 artifact (scripts/vm-test-arm64).
    VmTestArm64(vm::Arm64Args),
    /// The Secure Boot VM test: Debian's signed boot chain under OVMF, a
    /// MOK enrolled, what the build signed installed
    /// (scripts/vm-test-secureboot).
    VmTestSecureboot(vm::SecureBootArgs),
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum ToolName {
    /// etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet, kwok (a directory)
    K8s,
    Helm,
    OmParser,
    /// NVIDIA's device plugin and the kubelet double (a directory)
    DevicePlugin,
    S3Server,
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn main() -> ExitCode {
    match dispatch(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn dispatch(cli: Cli) -> Result<()> {
    let repo = std::fs::canonicalize(repo())?;
    match cli.command {
        Command::Test | Command::CiSetup => {
            let setup = matches!(cli.command, Command::CiSetup);
            let mut r = pipeline::Run::new(&repo, if setup { "ci-setup" } else { "stages" })?;
            let res = if setup { r.ci_setup() } else { r.test() };
            eprint!("{}", r.table());
            res?;
            eprintln!("all stages passed");
            Ok(())
        }
        Command::Tool { name, cached } => {
            let cache = cache::Cache::resolve()?;
            let p = match name {
                ToolName::K8s => tools::k8s(&repo, &cache, cached)?,
                ToolName::Helm => tools::helm(&cache)?,
                ToolName::OmParser => tools::om_parser(&repo, &cache)?,
                ToolName::DevicePlugin => tools::device_plugin(&repo, &cache)?,
                ToolName::S3Server => tools::s3_server(&cache)?,
            };
            println!("{}", p.display());
            Ok(())
        }
        Command::StaticBuild { bin, arch } => {
            // x86_64 builds the installer and the operator in one call, as
            // every other caller does, so their shared dependencies compile
            // once for both.
            let bins: Vec<&str> = match arch {
                static_build::Arch::X86_64 => vec!["gpu-driver-installer", "gpu-driver-operator"],
                static_build::Arch::Aarch64 => vec![bin.as_str()],
            };
            let paths = static_build::build(&repo, &bins, arch)?;
            let i = bins.iter().position(|b| *b == bin).ok_or_else(|| {
                anyhow::anyhow!(
                    "unknown binary {bin} (gpu-driver-installer or gpu-driver-operator)"
                )
            })?;
            println!("{}", paths[i].display());
            Ok(())
        }
        Command::E2e { out } => e2e::run_all(&repo, out),
        Command::Cluster { cmd } => cluster::run(&repo, cmd),
        Command::CacheRoot => {
            println!("{}", cache::Cache::resolve()?.root().display());
            Ok(())
        }
        Command::TestData => {
            let dir = test_data::fetch(&cache::Cache::resolve()?)?;
            println!("{}", dir.display());
            Ok(())
        }
        Command::TestRunfile { builder_root } => {
            let run = test_data::runfile::build(&cache::Cache::resolve()?, &builder_root)?;
            println!("{}", run.display());
            Ok(())
        }
        Command::NodeRoot { rebuild } => {
            println!("{}", node_root::build(&repo, rebuild)?.display());
            Ok(())
        }
        Command::BuilderRoot(a) => builder_root::run(a),
        Command::Matrix(a) => match matrix::run_matrix(&repo, a)? {
            0 => Ok(()),
            code => std::process::exit(code.into()),
        },
        Command::Images { cmd } => images::run(&repo, cmd),
        Command::RealNode(args) => real_node::run(&repo, args),
        Command::Bench { cmd } => bench::run(&repo, cmd),
        Command::VmTest(a) => vm::x86(&repo, a),
        Command::VmTestArm64(a) => vm::arm64(&repo, a),
        Command::VmTestSecureboot(a) => vm::secure_boot(&repo, a),
    }
}
