use serde_json::json;

#[test]
fn reads_apiserver_timestamps() {
    assert_eq!(super::parse_time("1970-01-01T00:00:00Z").unwrap(), 0);
    assert_eq!(
        super::parse_time("2026-12-07T20:30:01Z").unwrap(),
        1796675401
    );
    assert_eq!(
        super::parse_time("2024-02-29T12:00:00Z").unwrap(),
        1709208000
    );
    assert!(super::parse_time("").is_err());
    assert!(super::parse_time("2026-12-07T20:30:01.5Z").is_err());
}

/// A Job's pod list as kubectl prints it (trimmed).
fn pods() -> serde_json::Value {
    json!({"items": [{
      "metadata": {"name": "gpu-driver-build-abc-x"},
      "status": {"phase": "Succeeded", "containerStatuses": [
        {"name": "build", "state": {"terminated": {"exitCode": 0, "reason": "Completed",
          "message": "{\"status\":{\"reason\":\"Built\",\"steps\":[{\"kind\":\"FetchResult\",\"message\":\"http://10.0.2.2:41234/gpu-cache/real-node/packages/NVIDIA-Linux-x86_64-580.178.04.run\"},{\"kind\":\"Store\",\"message\":\"stored by this build\"}]}}"}}},
        {"name": "sidecar", "state": {"running": {"startedAt": "2026-12-07T20:30:01Z"}}}
      ]}
    }]})
}

#[test]
fn reads_termination_messages() {
    let m = super::messages(&pods());
    assert!(m.ends_with("}}\n"));
    let docs = super::json_stream(&m).unwrap();
    assert_eq!(docs.len(), 1);
    assert_eq!(docs[0]["status"]["reason"], "Built");
    assert!(super::json_stream("{\"a\":1}\n{\"b\":2}\n").unwrap().len() == 2);
    assert!(super::json_stream("not json").is_err());
    assert_eq!(super::messages(&json!({"items": []})), "");
}

#[test]
fn reads_the_gpu_pods_report() {
    let pod = json!({
      "metadata": {"creationTimestamp": "2026-12-07T20:40:00Z"},
      "status": {"phase": "Succeeded",
        "conditions": [{"type": "Ready", "lastTransitionTime": "2026-12-07T20:40:30Z"},
                       {"type": "PodScheduled", "lastTransitionTime": "2026-12-07T20:40:00Z"}],
        "containerStatuses": [
          {"name": "cuda", "state": {"terminated": {"exitCode": 0,
            "message": "NVIDIA_VISIBLE_DEVICES=GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182\ndevices: nvidia0 nvidiactl \n"}}},
          {"name": "scrape", "state": {"terminated": {"exitCode": 0,
            "message": "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",pod=\"gpu-pod\"} 37\n"}}}]}
    });
    assert_eq!(super::scheduled_after(&pod).unwrap(), 0);
    let cuda = super::termination(&pod, "cuda");
    assert_eq!(
        super::prefixed(&cuda, "NVIDIA_VISIBLE_DEVICES="),
        "GPU-6f3c2a1e-0b7d-4c5e-9a21-3d4e5f607182"
    );
    assert_eq!(
        super::prefixed(&cuda, "devices: ").trim_end_matches(' '),
        "nvidia0 nvidiactl"
    );
    assert_eq!(
        super::termination(&pod, "scrape"),
        "DCGM_FI_DEV_GPU_UTIL{gpu=\"0\",pod=\"gpu-pod\"} 37\n\n"
    );
    assert_eq!(super::termination(&pod, "none"), "");
}

#[test]
fn flattens_lists() {
    assert_eq!(
        super::flatten("usr/bin/nvidia-smi\nusr/lib/x86_64-linux-gnu/libcuda.so.1\n"),
        "usr/bin/nvidia-smi usr/lib/x86_64-linux-gnu/libcuda.so.1"
    );
    assert_eq!(super::flatten(""), "");
}

#[test]
fn lists_secret_volumes() {
    let job = json!({"spec": {"template": {"spec": {"volumes": [
      {"name": "host", "hostPath": {"path": "/"}},
      {"name": "signing", "secret": {"secretName": "module-signing"}}]}}}});
    assert_eq!(super::secret_volumes(&job), "[\"module-signing\"]");
    assert_eq!(super::secret_volumes(&json!({"spec": {}})), "[]");
}
