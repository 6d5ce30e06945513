//! The CRDs checked in under `deploy/crds/` are exactly what the types generate.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

const REGENERATE: &str = "regenerate them with `cargo run -p lvms -- crd --split deploy/crds` \
     (from the workspace root) and review the diff";

fn crds_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/crds")
}

#[test]
fn checked_in_crds_match_the_generated_ones() {
    let files = lvms_api::crd::files().expect("CRDs render");
    let mut stale = Vec::new();
    for (name, generated) in &files {
        let path = crds_dir().join(name);
        match std::fs::read_to_string(&path) {
            Ok(on_disk) if on_disk == *generated => {}
            Ok(on_disk) => {
                let line = on_disk
                    .lines()
                    .zip(generated.lines())
                    .position(|(a, b)| a != b)
                    .map_or_else(
                        || on_disk.lines().count().min(generated.lines().count()) + 1,
                        |i| i + 1,
                    );
                stale.push(format!(
                    "deploy/crds/{name} differs from the generated CRD (first at line {line})"
                ));
            }
            Err(e) => stale.push(format!("deploy/crds/{name} cannot be read: {e}")),
        }
    }
    assert!(stale.is_empty(), "{}\n{REGENERATE}", stale.join("\n"));
}

#[test]
fn deploy_crds_holds_no_file_the_types_do_not_generate() {
    let expected: Vec<String> = lvms_api::crd::files()
        .expect("CRDs render")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    let extra: Vec<String> = std::fs::read_dir(crds_dir())
        .expect("deploy/crds exists")
        .map(|e| {
            e.expect("dir entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|name| !expected.contains(name) && name != KUSTOMIZATION)
        .collect();
    assert!(
        extra.is_empty(),
        "deploy/crds has files no type generates: {extra:?}; delete them, then {REGENERATE}"
    );
}

/// Lists the CRD files for `kubectl kustomize` (deploy/base uses it).
const KUSTOMIZATION: &str = "kustomization.yaml";

#[test]
fn crds_kustomization_lists_exactly_the_generated_files() {
    let mut expected: Vec<String> = lvms_api::crd::files()
        .expect("CRDs render")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    expected.sort();
    let text = std::fs::read_to_string(crds_dir().join(KUSTOMIZATION))
        .expect("deploy/crds/kustomization.yaml exists");
    let doc: serde_json::Value = serde_norway::from_str(&text).expect("valid YAML");
    let mut listed: Vec<String> = doc["resources"]
        .as_array()
        .expect("a resources list")
        .iter()
        .map(|r| r.as_str().expect("a file name").to_owned())
        .collect();
    listed.sort();
    assert_eq!(
        listed, expected,
        "deploy/crds/kustomization.yaml must list every generated CRD file and nothing else"
    );
}

#[test]
fn crd_files_are_named_like_controller_gen() {
    let names: Vec<String> = lvms_api::crd::files()
        .expect("CRDs render")
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    assert_eq!(
        names,
        [
            "lvm.topolvm.io_lvmclusters.yaml",
            "lvm.topolvm.io_lvmvolumegroups.yaml",
            "lvm.topolvm.io_lvmvolumegroupnodestatuses.yaml",
            "topolvm.io_logicalvolumes.yaml",
        ]
    );
}

#[test]
fn multi_document_output_is_the_concatenation_of_the_files() {
    let all = lvms_api::crd::all_yaml().expect("CRDs render");
    let joined: String = lvms_api::crd::files()
        .expect("CRDs render")
        .into_iter()
        .map(|(_, yaml)| yaml)
        .collect();
    assert_eq!(all, joined);
    assert_eq!(all.matches("\n---\n").count() + 1, 4, "four documents");
}
