//! The catalog: exclusions, newest releases, Garden Linux kernels,
//! arm64 packages, `catalog check`, the compatibility table.

use super::*;

#[test]
fn catalog_exclusions_refuse_known_broken_pairs() {
    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("catalog.toml");
    let embedded =
        fs::read_to_string(crate::support::repo_root().join("catalog/catalog.toml")).unwrap();
    fs::write(
        &cat,
        format!(
            "{embedded}\n[[exclusions]]\ndriver = \"550\"\nkernelMin = \"6.12\"\nreason = \"test: kernel API changed\"\nevidence = \"measured: this test\"\n"
        ),
    )
    .unwrap();
    let r = run_on(
        "debian-13-hgx-a100",
        &[
            "--catalog",
            cat.to_str().unwrap(),
            "resolve",
            "--driver-version",
            "550.163.01",
        ],
    );
    let s = &r.doc["status"];
    assert_eq!(r.code, 11);
    assert_eq!(s["reason"], "IncompatibleKernel");
    assert!(
        s["message"]
            .as_str()
            .unwrap()
            .contains("test: kernel API changed")
    );
    assert_eq!(r.doc["spec"]["catalog"], cat.to_str().unwrap());
    // The same pair on an older kernel is fine.
    let r = run_on(
        "debian-12-t4-headers",
        &[
            "--catalog",
            cat.to_str().unwrap(),
            "resolve",
            "--driver-version",
            "550.163.01",
        ],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
}

#[test]
fn a_broken_catalog_is_a_clear_failure() {
    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("catalog.toml");
    fs::write(&cat, "schemaVersion = 1\ndefaultBranch = 7\n").unwrap();
    for cmd in ["detect", "resolve"] {
        let r = run_on(
            "gardenlinux-1592-t4",
            &["--catalog", cat.to_str().unwrap(), cmd],
        );
        assert_eq!(r.code, 4, "{cmd}");
        assert_eq!(r.doc["status"]["reason"], "CatalogInvalid");
        assert!(r.message().contains(cat.to_str().unwrap()));
    }
    let r = run_on(
        "gardenlinux-1592-t4",
        &["--catalog", "/nonexistent/catalog.toml", "resolve"],
    );
    assert_eq!(r.code, 4);
    assert!(
        r.message()
            .starts_with("the catalog (--catalog) /nonexistent/catalog.toml does not exist"),
        "{}",
        r.message()
    );
}

#[test]
fn the_embedded_catalog_refuses_measured_broken_pairs() {
    // `resolve` of 550.163.01 on 6.12.117+deb13, then `flavor`.
    let resolve = |flavor: &[&str]| {
        let mut args = vec![
            "--kernel-release",
            "6.12.117+deb13-cloud-amd64",
            "resolve",
            "--driver-version",
            "550.163.01",
        ];
        args.extend_from_slice(flavor);
        run_on("debian-13-hgx-a100", &args)
    };
    // Measured: 550.163.01 open fails to compile on 6.12.117+deb13.
    let r = resolve(&["--flavor", "open"]);
    assert_eq!(r.code, 11, "{}", r.doc);
    assert_eq!(r.doc["status"]["reason"], "IncompatibleKernel");
    assert!(r.message().contains("pci_resize_resource"));
    // The proprietary flavor of the same pair builds, and auto picks it.
    let r = resolve(&[]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["moduleFlavor"], "proprietary");
}

fn catalog() -> gpu_driver_installer::catalog::Catalog {
    gpu_driver_installer::catalog::Catalog::embedded().unwrap()
}

#[test]
fn a_branch_resolves_to_its_newest_release_with_a_digest() {
    let cat = catalog();
    let x86 = gpu_driver_installer::node::CpuArch::X86_64;
    for branch in ["535", "570", "580", "590"] {
        let want = cat.default_release(branch, x86).unwrap().version.clone();
        let r = run_on(
            "gardenlinux-2150-h100",
            &["resolve", "--driver-version", branch],
        );
        let s = &r.doc["status"];
        assert_eq!(s["driverVersion"], want.as_str(), "{branch}: {s}");
        assert_eq!(s["driverVersionSource"], "flag");
        assert_eq!(s["package"]["checksumKnown"], true);
    }
    assert_eq!(
        cat.default_release("580", x86).unwrap().version,
        "580.178.04"
    );
    // A branch the catalog does not list: the message names those it does.
    let r = run_on(
        "gardenlinux-2150-h100",
        &["resolve", "--driver-version", "999"],
    );
    assert_eq!(r.code, 4);
    assert_eq!(r.doc["status"]["reason"], "InvalidArgument");
    let msg = r.message();
    assert!(msg.contains("branch 999") && msg.contains("580"), "{msg}");
}

#[test]
fn garden_linux_2150_8_refuses_the_drivers_that_cannot_compile_on_6_18_41() {
    // The default (580 newest) builds on 6.18.41.
    let r = run_on("gardenlinux-2150.8-l40s", &["resolve"]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["status"]["moduleFlavor"], "open");
    // 570 (any release) and 580 before 580.126.09 call pci_resize_resource
    // with 3 arguments.
    for v in ["570", "570.211.01", "580.95.05", "535.309.01"] {
        let r = run_on(
            "gardenlinux-2150.8-l40s",
            &["resolve", "--driver-version", v, "--flavor", "open"],
        );
        assert_eq!(
            r.doc["status"]["reason"], "IncompatibleKernel",
            "{v}: {}",
            r.doc
        );
        let msg = r.message();
        assert!(msg.contains("pci_resize_resource"), "{msg}");
    }
    // 580.126.09 is the first 580 that builds there.
    let r = run_on(
        "gardenlinux-2150.8-l40s",
        &["resolve", "--driver-version", "580.126.09"],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
    // The same 570 on 2150.0.0 (kernel 6.18.2) is fine.
    let r = run_on(
        "gardenlinux-2150-h100",
        &["resolve", "--driver-version", "570"],
    );
    assert_eq!(r.code, 0, "{}", r.doc);
}

#[test]
fn old_garden_linux_kernels_take_the_proprietary_modules_with_the_reason() {
    for name in [
        "gardenlinux-1592-t4",
        "gardenlinux-1760-a10g",
        "gardenlinux-1877-l4",
    ] {
        let r = run_on(name, &["resolve"]);
        let s = &r.doc["status"];
        assert_eq!(s["moduleFlavor"], "proprietary", "{name}: {s}");
        let why = s["flavorReason"].as_str().unwrap();
        assert!(why.contains("signed firmware"), "{name}: {why}");
        // Asking for the open modules there is refused, with the reason.
        let r = run_on(name, &["resolve", "--flavor", "open"]);
        assert_eq!(r.doc["status"]["reason"], "FlavorNotSupported", "{name}");
        let msg = r.message();
        assert!(msg.contains("GSP firmware"), "{name}: {msg}");
    }
    // From 1877.6 (6.12.56) and on other OSes, auto picks open again.
    let r = run_on(
        "gardenlinux-1877-arm64-t4g",
        &["--arch", "arm64", "resolve"],
    );
    assert_eq!(r.doc["status"]["moduleFlavor"], "open", "{}", r.doc);
    let r = run_on(
        "debian-13-hgx-a100",
        &["resolve", "--driver-version", "580"],
    );
    assert_eq!(r.doc["status"]["moduleFlavor"], "open", "{}", r.doc);
}

#[test]
fn secure_boot_on_is_a_warning_in_the_plan() {
    let r = run_on("gardenlinux-1877-l4", &["resolve"]);
    assert_eq!(r.code, 0);
    let warnings = r.doc["status"]["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| {
            let w = w.as_str().unwrap();
            w.contains("Secure Boot") && w.contains("ModuleSignatureRequired")
        }),
        "{warnings:?}"
    );
    assert_eq!(r.doc["status"]["signedModules"], true, "{}", r.doc);
    let r = run_on("gardenlinux-2150-h100", &["resolve"]);
    assert!(r.doc["status"].get("warnings").is_none());
    assert!(r.doc["status"].get("signedModules").is_none());
}

#[test]
fn arm64_nodes_get_the_aarch64_package_and_its_digest() {
    let r = run_on(
        "gardenlinux-1877-arm64-t4g",
        &["--arch", "arm64", "resolve"],
    );
    let s = &r.doc["status"];
    assert_eq!(r.code, 0, "{s}");
    assert_eq!(s["arch"], "aarch64");
    let url = s["package"]["url"].as_str().unwrap();
    assert!(url.contains("NVIDIA-Linux-aarch64-"), "{url}");
    let want = catalog()
        .driver_for_version(s["driverVersion"].as_str().unwrap())
        .unwrap()
        .sha256_for(gpu_driver_installer::node::CpuArch::Aarch64)
        .unwrap()
        .to_string();
    assert_eq!(s["package"]["sha256"], want.as_str());
    // The same node read as x86_64 gets the other file.
    let r = run_on(
        "gardenlinux-1877-arm64-t4g",
        &["--arch", "x86_64", "resolve"],
    );
    assert!(
        r.doc["status"]["package"]["url"]
            .as_str()
            .unwrap()
            .contains("NVIDIA-Linux-x86_64-")
    );
}

#[test]
fn the_catalog_check_passes_on_the_embedded_catalog_and_names_problems() {
    let r = run(&["catalog-check"]);
    assert_eq!(r.code, 0, "{}", r.doc);
    assert_eq!(r.doc["kind"], "CatalogCheck");
    assert_eq!(r.doc["status"]["reason"], "CatalogChecked");

    let dir = tempfile::tempdir().unwrap();
    let cat = dir.path().join("catalog.toml");
    let embedded =
        fs::read_to_string(crate::support::repo_root().join("catalog/catalog.toml")).unwrap();
    // A default branch whose only release has no digest, a policy that
    // sends Garden Linux 2150 (6.18) to 570, and an exclusion whose
    // evidence is hearsay.
    let broken = embedded
        .replace("defaultBranch = \"580\"", "defaultBranch = \"600\"")
        .replace(
            "# ---------------------------------------------------------------- policies",
            "[[drivers]]\nbranch = \"600\"\nversion = \"600.10.01\"\nchannel = \"datacenter\"\n\n[[policies]]\nname = \"gl-2150-570\"\nos = \"gardenlinux\"\nosVersions = [\"2150\"]\nbranch = \"570\"\n",
        )
        .replace(
            "[[flavorRules]]",
            "[[exclusions]]\ndriver = \"590\"\nreason = \"x\"\nevidence = \"a forum said so\"\n\n[[flavorRules]]",
        );
    assert_ne!(broken, embedded);
    fs::write(&cat, broken).unwrap();
    let r = run(&["--catalog", cat.to_str().unwrap(), "catalog-check"]);
    assert_eq!(r.code, 4, "{}", r.doc);
    assert_eq!(r.doc["status"]["reason"], "CatalogInvalid");
    let problems: Vec<String> = r.doc["status"]["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap().to_string())
        .collect();
    assert!(
        problems
            .iter()
            .any(|p| p.contains("600.10.01 has no aarch64 digest")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("Garden Linux 2150")
            && p.contains("570.211.01 (open) is excluded on 6.18.255")),
        "{problems:?}"
    );
    assert!(
        problems.iter().any(|p| p.contains("a forum said so")),
        "{problems:?}"
    );
}

/// The defaults table in docs/compatibility.md, from `catalog-check`.
fn defaults_table(defaults: &[Value]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = Vec::new();
    for d in defaults {
        let flavors: Vec<&str> = d["flavorsForTuringAndNewer"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap())
            .collect();
        let flavor = match flavors.as_slice() {
            [one] => one.to_string(),
            [first, then] => format!("{first}, then {then} (flavor rule)"),
            _ => flavors.join(", "),
        };
        let row = format!(
            "| {} | {} | {} | {} | {} | {} |",
            d["os"].as_str().unwrap(),
            d["osVersion"].as_str().unwrap(),
            d["kernelSeries"].as_str().unwrap(),
            d["driverVersion"].as_str().unwrap(),
            d["chosenBy"].as_str().unwrap(),
            flavor
        );
        let arch = d["arch"].as_str().unwrap().to_string();
        match rows.iter_mut().find(|(r, _)| *r == row) {
            Some((_, archs)) => archs.push(arch),
            None => rows.push((row, vec![arch])),
        }
    }
    let mut out = String::from(
        "| OS | version | kernel series | default driver | chosen by | auto flavor (Turing and newer) | CPU |\n|---|---|---|---|---|---|---|\n",
    );
    for (row, archs) in rows {
        out.push_str(&format!("{row} {} |\n", archs.join(", ")));
    }
    out
}

#[test]
fn the_compatibility_table_is_the_catalogs() {
    let r = run(&["catalog-check"]);
    let table = defaults_table(r.doc["status"]["defaults"].as_array().unwrap());
    let path = crate::support::repo_root().join("docs/compatibility.md");
    let doc = fs::read_to_string(&path).unwrap();
    const BEGIN: &str =
        "<!-- catalog defaults: generated by tests/it/cli/catalog.rs from catalog-check -->\n";
    const END: &str = "<!-- end of catalog defaults -->";
    let (Some(b), Some(e)) = (doc.find(BEGIN), doc.find(END)) else {
        panic!("docs/compatibility.md lacks the generated section markers");
    };
    let current = &doc[b + BEGIN.len()..e];
    if current != table {
        if std::env::var("UPDATE_DOCS").as_deref() == Ok("1") {
            let new = format!("{}{BEGIN}{table}{}", &doc[..b], &doc[e..]);
            fs::write(&path, new).unwrap();
        } else {
            panic!(
                "docs/compatibility.md's defaults table is out of date; regenerate with `UPDATE_DOCS=1 cargo test -p gpu-driver-tests --test it cli::catalog::the_compatibility_table`:\n{table}"
            );
        }
    }
}

/// `matrix-exclusions` prints what `scripts/matrix-exclusions` printed when
/// it was Python (expected-exclusions.toml is that script's output for the
/// fixture matrix): a covered pair and an unreadable one as comments, one
/// suggestion per branch, flavor and series with its lowest kernel.
#[test]
fn matrix_exclusions_suggest_what_the_catalog_lacks() {
    let dir = crate::support::repo_root().join("tests/fixtures/matrix");
    let want = fs::read_to_string(dir.join("expected-exclusions.toml")).unwrap();
    let catalog = crate::support::repo_root().join("catalog/catalog.toml");
    let catalog = catalog.to_str().unwrap();
    for args in [
        &[
            "matrix-exclusions",
            "--matrix",
            "matrix.json",
            "--catalog",
            catalog,
        ][..],
        // The embedded catalog is catalog/catalog.toml.
        &["matrix-exclusions", "--matrix", "matrix.json"][..],
    ] {
        let out = bin().args(args).current_dir(&dir).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert_eq!(String::from_utf8(out.stdout).unwrap(), want, "{args:?}");
    }
    let out = bin()
        .args(["matrix-exclusions", "--matrix", "/nonexistent/matrix.json"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/matrix.json"));
}
