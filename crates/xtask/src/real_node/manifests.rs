//! The manifests the run applies, written into `<out>` before they are
//! applied (they stay there to read). The pods' scripts run inside their
//! containers and stay shell.

use super::NODE;

/// A kustomize overlay of deploy/ with the built images. The admission
/// policy is left out: it requires digest-pinned images from the owner's
/// registries, and these are local tags (tests/it/admission.rs tests it
/// against the real apiserver).
pub(super) fn overlay(deploy_rel: &str, operator: &str, exporter: &str) -> String {
    let (op_name, op_tag) = split_tag(operator);
    let (ex_name, ex_tag) = split_tag(exporter);
    format!(
        r#"apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - {deploy_rel}
images:
  - name: ghcr.io/gardenlinux/gpu-driver-operator
    newName: {op_name}
    newTag: "{op_tag}"
  - name: ghcr.io/gardenlinux/gpu-driver-exporter
    newName: {ex_name}
    newTag: "{ex_tag}"
patches:
  # The exporter as deploy/ ships it, but for what the missing container
  # toolkit forces: no nvidia RuntimeClass, so nothing puts the driver's
  # libnvidia-ml.so.1 into the container; it reads it from the driver root,
  # mounted read-only, as NVIDIA's device plugin does.
  - target: {{kind: DaemonSet, name: gpu-driver-exporter}}
    patch: |
      - op: remove
        path: /spec/template/spec/runtimeClassName
      - op: add
        path: /spec/template/spec/containers/0/env/-
        value: {{name: LD_LIBRARY_PATH, value: /driver-root/usr/lib/x86_64-linux-gnu}}
      - op: add
        path: /spec/template/spec/containers/0/volumeMounts/-
        value: {{name: driver-root, mountPath: /driver-root, readOnly: true}}
      - op: add
        path: /spec/template/spec/volumes/-
        value: {{name: driver-root, hostPath: {{path: /var/lib/gpu-driver/drivers/current, type: Directory}}}}
  - target: {{kind: ValidatingAdmissionPolicy}}
    patch: |
      $patch: delete
      apiVersion: admissionregistration.k8s.io/v1
      kind: ValidatingAdmissionPolicy
      metadata: {{name: unused}}
  - target: {{kind: ValidatingAdmissionPolicyBinding}}
    patch: |
      $patch: delete
      apiVersion: admissionregistration.k8s.io/v1
      kind: ValidatingAdmissionPolicyBinding
      metadata: {{name: unused}}
"#
    )
}

/// `name:tag` split at the tag's colon (a registry's port stays in the name).
fn split_tag(image: &str) -> (&str, &str) {
    match image.rsplit_once(':') {
        Some((n, t)) if !t.contains('/') => (n, t),
        _ => (image, image),
    }
}

/// The observer pod. The apiserver cannot reach the VM's kubelet (no exec,
/// no logs): the pod reports through its termination message, which the
/// kubelet posts. It fails at once if the directory is not empty when it
/// starts, then waits for the driver root to appear and lists it.
pub(super) fn observer(image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: driver-root-observer
  namespace: default
spec:
  nodeName: {NODE}
  restartPolicy: Never
  tolerations: [{{operator: Exists}}]
  containers:
    - name: observer
      image: {image}
      command:
        - bash
        - -c
        - |
          [ -z "$(ls -A /run/nvidia/driver)" ] || {{ echo "not empty at start" >/dev/termination-log; exit 1; }}
          for _ in $(seq 900); do
            [ -z "$(ls -A /run/nvidia/driver)" ] || break
            sleep 1
          done
          sleep 2
          find /run/nvidia/driver/ -mindepth 1 -printf '%P\n' | sort >/dev/termination-log
      volumeMounts:
        - name: driver
          mountPath: /run/nvidia/driver
          mountPropagation: HostToContainer
  volumes:
    - name: driver
      hostPath: {{path: /run/nvidia/driver, type: DirectoryOrCreate}}
"#
    )
}

/// The GpuDriver of the cold join: the store (read Secret for installs,
/// write Secret for builds), builds on the one GPU pool, module signing.
pub(super) fn gpudriver(builder: &str, installer: &str) -> String {
    format!(
        r#"apiVersion: gpu-driver.gardenlinux.io/v1alpha1
kind: GpuDriver
metadata:
  name: default
spec:
  nodeSelector:
    worker.gardener.cloud/pool: gpu
  gpuDetection:
    nfd: true
  driver:
    flavor: auto
    catalogConfigMap: real-node-catalog
  builderImages:
    - gardenLinuxVersion: "1877"
      image: {builder}
  installerImage: {installer}
  startupTaint: gpu-driver.gardenlinux.io/driver-not-ready
  cache:
    url: s3://gpu-cache/real-node
    secretName: cache-reader
    writeSecretName: cache-writer
    allowHttp: true
  build:
    # One node: the build Job runs on the GPU node it serves.
    nodeSelector:
      worker.gardener.cloud/pool: gpu
    allowGpuNodes: true
    signingSecretName: module-signing
"#
    )
}

/// The GPU pod. Container cuda holds the GPU and reports what it was
/// given; container scrape reads the exporter (pod IP: no kube-proxy on
/// this node) until it names this pod, then both end and post their
/// termination messages.
pub(super) fn gpu_pod(image: &str, exporter_ip: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: default
spec:
  restartPolicy: Never
  containers:
    - name: cuda
      image: {image}
      resources:
        limits: {{nvidia.com/gpu: 1}}
      command:
        - bash
        - -c
        - |
          {{ echo "NVIDIA_VISIBLE_DEVICES=${{NVIDIA_VISIBLE_DEVICES:-}}"
            echo "devices: $(cd /host-dev && ls -d nvidia* 2>/dev/null | tr '\n' ' ')"; }} >/dev/termination-log
          for _ in $(seq 600); do [ -e /shared/done ] && exit 0; sleep 1; done
          exit 1
      volumeMounts:
        - {{name: shared, mountPath: /shared}}
        - {{name: host-dev, mountPath: /host-dev, readOnly: true}}
    - name: scrape
      image: {image}
      command:
        - bash
        - -c
        - |
          for _ in $(seq 300); do
            if exec 3<>/dev/tcp/{exporter_ip}/9400; then
              printf 'GET /metrics HTTP/1.1\r\nHost: exporter\r\nConnection: close\r\n\r\n' >&3
              grep '^DCGM_FI_DEV_GPU_UTIL{{.*pod="gpu-pod"' <&3 >/tmp/line && break
              exec 3<&-
            fi
            sleep 2
          done
          touch /shared/done
          cat /tmp/line >/dev/termination-log
          [ -s /tmp/line ]
      volumeMounts:
        - {{name: shared, mountPath: /shared}}
  volumes:
    - {{name: shared, emptyDir: {{}}}}
    # Without the toolkit nothing puts /dev/nvidia* into the container: the
    # pod looks at the host's, read-only.
    - {{name: host-dev, hostPath: {{path: /dev, type: Directory}}}}
"#
    )
}

/// A privileged pod that reboots the guest `sleep` seconds after it starts
/// (QEMU keeps the disk's snapshot across the reset).
pub(super) fn reboot(name: &str, sleep: u32, image: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  namespace: default
spec:
  nodeName: {NODE}
  restartPolicy: Never
  hostPID: true
  tolerations: [{{operator: Exists}}]
  containers:
    - name: reboot
      image: {image}
      securityContext: {{privileged: true}}
      command: [bash, -c, "sleep {sleep}; sync; echo b >/proc/sysrq-trigger"]
"#
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn splits_image_tags() {
        assert_eq!(
            super::split_tag("localhost/gpu-driver-operator:4d84ee287609"),
            ("localhost/gpu-driver-operator", "4d84ee287609")
        );
        assert_eq!(
            super::split_tag("localhost:5000/gpu-driver-exporter:v1"),
            ("localhost:5000/gpu-driver-exporter", "v1")
        );
    }

    #[test]
    fn escapes_the_pod_scripts() {
        let p = super::gpu_pod("img", "10.88.0.7");
        assert!(p.contains("echo \"NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES:-}\""));
        assert!(p.contains("exec 3<>/dev/tcp/10.88.0.7/9400"));
        assert!(p.contains("grep '^DCGM_FI_DEV_GPU_UTIL{.*pod=\"gpu-pod\"' <&3"));
        let r = super::reboot("reboot-join", 3, "img");
        assert!(r.contains("  name: reboot-join\n"));
        assert!(r.contains("\"sleep 3; sync; echo b >/proc/sysrq-trigger\""));
    }
}
