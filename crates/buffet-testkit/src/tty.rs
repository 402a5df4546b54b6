//! Pseudo-terminals, for tests of what a program prints when its output is a terminal.

/// Opens a pseudo-terminal: the controller side (read what the program writes) and the
/// terminal side (give it to the child as its stdout or stderr; `isatty` is true there).
pub fn open_pty() -> std::io::Result<(std::fs::File, std::os::fd::OwnedFd)> {
    crate::sys::open_pty()
}
