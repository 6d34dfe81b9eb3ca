//! Writes the statistics file (`TANDEM_EMU_STATS`) at process exit.
//!
//! An `atexit` handler runs on a normal `exit` (returning from `main` included) whichever
//! language the program is in, without the program's cooperation.

use crate::state::try_driver;
use crate::stats;

extern "C" fn write_at_exit() {
    // Nothing may unwind out of an atexit handler.
    let _ = std::panic::catch_unwind(flush);
}

/// Writes the statistics file now, if `TANDEM_EMU_STATS` named one.
pub fn flush() {
    if let Some(driver) = try_driver() {
        if let Some(path) = &driver.config.stats {
            stats::write(path, driver.config.devices, driver.config.driver_version);
        }
    }
}

/// Registers the exit handler that calls [`flush`] (once, from `cuInit`).
pub fn register() {
    // SAFETY: registering a plain function that never unwinds.
    if unsafe { libc::atexit(write_at_exit) } != 0 {
        eprintln!("tandem-cuda-emu: cannot register the TANDEM_EMU_STATS writer with atexit");
    }
}
