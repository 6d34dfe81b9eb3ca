//! Output that never panics. `println!` panics when stdout is closed (`mnist-train | head`),
//! and a panic in a worker thread's progress line would fail the worker and lose the run.
//! Here a failed write marks stdout as closed instead: a training run then stops as after a
//! Ctrl-C (checkpoint written), and the process ends with the status a broken pipe gives.

use std::fmt::Display;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicU8, Ordering};

const OPEN: u8 = 0;
const BROKEN_PIPE: u8 = 1;
const FAILED: u8 = 2;

static STDOUT: AtomicU8 = AtomicU8::new(OPEN);

/// The exit status of a process killed by SIGPIPE (128 + 13), as shells report it.
pub const BROKEN_PIPE_STATUS: i32 = 141;

/// Writes one line to stdout; once a write has failed, nothing more is written.
pub fn line(text: impl Display) {
    if STDOUT.load(Ordering::Relaxed) != OPEN {
        return;
    }
    let mut out = std::io::stdout().lock();
    if let Err(e) = writeln!(out, "{text}").and_then(|()| out.flush()) {
        let state = if e.kind() == ErrorKind::BrokenPipe {
            BROKEN_PIPE
        } else {
            warn(format!("cannot write to stdout: {e}"));
            FAILED
        };
        STDOUT.store(state, Ordering::Relaxed);
    }
}

/// Writes one line to stderr, ignoring failure: there is nowhere left to report it.
pub fn warn(text: impl Display) {
    let _ = writeln!(std::io::stderr().lock(), "{text}");
}

/// Whether stdout has stopped taking output.
pub fn closed() -> bool {
    STDOUT.load(Ordering::Relaxed) != OPEN
}

/// The status the process should end with because stdout failed, if it did: a broken pipe
/// ends quietly as SIGPIPE would, another failure (a full disk behind a redirect) as an error.
pub fn failure_status() -> Option<i32> {
    match STDOUT.load(Ordering::Relaxed) {
        BROKEN_PIPE => Some(BROKEN_PIPE_STATUS),
        FAILED => Some(1),
        _ => None,
    }
}

/// `println!` through [`output::line`](crate::output::line): never panics on a closed stdout.
#[macro_export]
macro_rules! out {
    () => {
        $crate::output::line("")
    };
    ($($arg:tt)*) => {
        $crate::output::line(format_args!($($arg)*))
    };
}

#[cfg(all(test, unix))]
mod tests {
    use std::fs::File;
    use std::os::fd::AsRawFd;
    use std::process::{Command, Output};

    use super::*;

    /// Runs [`child`] in a process of its own (stdout's state is the process's) with its
    /// writes going to `target`: `open` (the pipe this test reads), `full` (`/dev/full`, where
    /// every write fails for want of space) or `closed` (a pipe nobody reads).
    fn run_child(target: &str) -> Output {
        let output = Command::new(std::env::current_exe().expect("the test binary"))
            .args([
                "--exact",
                "output::tests::child",
                "--ignored",
                "--nocapture",
            ])
            .args(["--test-threads", "1"])
            .env("TANDEM_TEST_STDOUT", target)
            .output()
            .expect("running the child");
        assert!(output.status.success(), "{output:?}");
        output
    }

    fn text(bytes: &[u8]) -> String {
        String::from_utf8_lossy(bytes).into_owned()
    }

    /// Not a test of its own: what [`run_child`] runs (with `--ignored`). It points file
    /// descriptor 1 at the target for its two lines only, so that the test harness's own
    /// output still reaches the pipe.
    #[test]
    #[ignore = "the child process of run_child"]
    fn child() {
        let target = std::env::var("TANDEM_TEST_STDOUT").expect("run by run_child, which sets it");
        // SAFETY: plain calls on descriptors this test opens and closes itself; fd 1 is put back
        // before anything else writes to it.
        let saved = unsafe { libc::dup(1) };
        assert!(saved >= 0);
        match target.as_str() {
            "full" => {
                let full = File::options().write(true).open("/dev/full").unwrap();
                assert_eq!(unsafe { libc::dup2(full.as_raw_fd(), 1) }, 1);
            }
            "closed" => {
                let mut ends = [0; 2];
                assert_eq!(unsafe { libc::pipe(ends.as_mut_ptr()) }, 0);
                unsafe {
                    libc::close(ends[0]);
                    assert_eq!(libc::dup2(ends[1], 1), 1);
                    libc::close(ends[1]);
                }
            }
            _ => {}
        }
        crate::out!("first {}", 1);
        line("second");
        let closed_then = closed();
        unsafe {
            assert_eq!(libc::dup2(saved, 1), 1);
            libc::close(saved);
        }
        warn(format!(
            "closed {closed_then}, status {:?}",
            failure_status()
        ));
    }

    #[test]
    fn lines_reach_an_open_stdout() {
        let output = run_child("open");
        assert!(
            text(&output.stdout).contains("first 1\nsecond\n"),
            "{output:?}"
        );
        assert!(text(&output.stderr).contains("closed false, status None"));
    }

    #[test]
    fn a_failing_stdout_is_one_warning_and_an_error_status() {
        let stderr = text(&run_child("full").stderr);
        assert_eq!(
            stderr.matches("cannot write to stdout").count(),
            1,
            "{stderr}"
        );
        assert!(stderr.contains("closed true, status Some(1)"), "{stderr}");
    }

    #[test]
    fn a_closed_stdout_ends_quietly_as_a_broken_pipe() {
        let stderr = text(&run_child("closed").stderr);
        assert!(!stderr.contains("cannot write"), "{stderr}");
        assert!(stderr.contains("closed true, status Some(141)"), "{stderr}");
    }
}
