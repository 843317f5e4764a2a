//! The command line's own output. A reader that closes the pipe early
//! (`probeok check-config --config big.toml | head`) ends the process quietly with success, as
//! `grep` and `rg` do, where `println!` would panic with a backtrace.

use std::fmt::Arguments;
use std::io::{ErrorKind, Write};

/// Writes to standard output. A closed pipe exits 0 at once; any other write error is said
/// once on standard error and exits 2 (a runtime failure).
pub fn print(args: Arguments<'_>) {
    write(args, false);
}

/// [`print`] with a newline.
pub fn println(args: Arguments<'_>) {
    write(args, true);
}

fn write(args: Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let result = out
        .write_fmt(args)
        .and_then(|()| {
            if newline {
                out.write_all(b"\n")
            } else {
                Ok(())
            }
        })
        .and_then(|()| out.flush());
    match result {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::BrokenPipe => std::process::exit(0),
        Err(e) => {
            eprintln!("error: cannot write the output: {e}");
            std::process::exit(2);
        }
    }
}
