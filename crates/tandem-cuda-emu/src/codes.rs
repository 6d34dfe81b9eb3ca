//! The `CUresult` codes this driver returns, with the names and descriptions that
//! `cuGetErrorName` / `cuGetErrorString` report.
//!
//! Only codes of cust_raw 0.11.3's `CUresult` enum (CUDA 11.4's list) appear here, because cust
//! turns any other value into an "unknown error"; the `exports` test checks every entry of
//! [`ALL`] against that enum. Every code the driver returns comes from this module.

/// The driver API's result type: a C enum, `int`-sized.
pub type CUresult = u32;

macro_rules! codes {
    ($($name:ident = $value:literal, $text:literal;)*) => {
        $(
            #[doc = $text]
            pub const $name: CUresult = $value;
        )*
        /// Every code: (name, value, description), for `cuGetErrorName` / `cuGetErrorString`.
        pub const ALL: &[(&str, CUresult, &str)] = &[$((stringify!($name), $value, $text)),*];
        /// [`ALL`] with NUL-terminated name and description: the static C strings that
        /// `cuGetErrorName` / `cuGetErrorString` hand out.
        pub const ALL_C: &[(CUresult, &str, &str)] =
            &[$(($value, concat!(stringify!($name), "\0"), concat!($text, "\0"))),*];
    };
}

codes! {
    CUDA_SUCCESS = 0, "no error";
    CUDA_ERROR_INVALID_VALUE = 1, "invalid argument";
    CUDA_ERROR_OUT_OF_MEMORY = 2, "out of memory";
    CUDA_ERROR_NOT_INITIALIZED = 3, "initialization error";
    CUDA_ERROR_NO_DEVICE = 100, "no CUDA-capable device is detected";
    CUDA_ERROR_INVALID_DEVICE = 101, "invalid device ordinal";
    CUDA_ERROR_INVALID_IMAGE = 200, "device kernel image is invalid";
    CUDA_ERROR_INVALID_CONTEXT = 201, "invalid device context";
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209, "no kernel image is available for execution on the device";
    CUDA_ERROR_PEER_ACCESS_UNSUPPORTED = 217, "peer access is not supported between these two devices";
    CUDA_ERROR_INVALID_PTX = 218, "a PTX JIT compilation failed";
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222, "the provided PTX was compiled with an unsupported toolchain.";
    CUDA_ERROR_INVALID_HANDLE = 400, "invalid resource handle";
    CUDA_ERROR_NOT_FOUND = 500, "named symbol not found";
    CUDA_ERROR_NOT_READY = 600, "device not ready";
    CUDA_ERROR_ILLEGAL_ADDRESS = 700, "an illegal memory access was encountered";
    CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED = 704, "peer access is already enabled";
    CUDA_ERROR_PEER_ACCESS_NOT_ENABLED = 705, "peer access has not been enabled";
    CUDA_ERROR_MISALIGNED_ADDRESS = 716, "misaligned address";
    CUDA_ERROR_LAUNCH_FAILED = 719, "unspecified launch failure";
    CUDA_ERROR_NOT_SUPPORTED = 801, "operation not supported";
    CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED = 900, "operation not permitted when stream is capturing";
    CUDA_ERROR_STREAM_CAPTURE_INVALIDATED = 901, "operation failed due to a previous error during capture";
    CUDA_ERROR_STREAM_CAPTURE_UNMATCHED = 903, "capture was not initiated in this stream";
    CUDA_ERROR_UNKNOWN = 999, "unknown error";
}

/// The (name, description) of `code`, if it is one of [`ALL`].
pub fn describe(code: CUresult) -> Option<(&'static str, &'static str)> {
    ALL.iter()
        .find(|(_, value, _)| *value == code)
        .map(|(name, _, text)| (*name, *text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_code_is_described_by_its_own_name_and_text() {
        assert_eq!(
            describe(CUDA_ERROR_ILLEGAL_ADDRESS),
            Some((
                "CUDA_ERROR_ILLEGAL_ADDRESS",
                "an illegal memory access was encountered"
            ))
        );
        assert_eq!(describe(46), None);
    }
}
