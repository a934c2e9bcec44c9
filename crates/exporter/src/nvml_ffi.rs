//! The one NVML call nvml-wrapper 0.13 does not wrap:
//! `nvmlDeviceGetGpuInstanceId` (the DCGM label `GPU_I_ID` of a MIG
//! device). It is the crate's own dlopen'ed function table entry, called
//! with the crate's device handle; this module is the exporter's only
//! `unsafe`.

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};

/// The GPU instance ID of a MIG device handle.
pub fn gpu_instance_id(device: &Device) -> Result<u32, NvmlError> {
    let f = device
        .nvml()
        .lib()
        .nvmlDeviceGetGpuInstanceId
        .as_ref()
        .map_err(|e| NvmlError::FailedToLoadSymbol(e.to_string()))?;
    let mut id: u32 = 0;
    // SAFETY: `f` was resolved from the loaded NVML library with
    // nvmlDeviceGetGpuInstanceId's C signature (nvml-wrapper-sys's bindings of
    // nvml.h); `device.handle()` is a live handle of that library (the
    // Device borrows its Nvml), and `id` is a valid out pointer for the call.
    let code = unsafe { f(device.handle(), &mut id) };
    nvml_try(code)?;
    Ok(id)
}
