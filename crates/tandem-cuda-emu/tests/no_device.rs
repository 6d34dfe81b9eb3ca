//! `TANDEM_EMU_DEVICES=0`: a machine without GPUs.

mod common;

use common::*;

#[test]
fn zero_devices_is_no_device() {
    std::env::set_var("TANDEM_EMU_DEVICES", "0");
    check!(CUDA_ERROR_NO_DEVICE, cuInit(0));
    let mut n = 0;
    check!(CUDA_ERROR_NOT_INITIALIZED, cuDeviceGetCount(&mut n));
}
