//! Forwarding worker output line by line, optionally prefixed with the rank.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::sync::mpsc::Sender;
use std::thread;

/// Lines longer than this are forwarded in pieces of this size (each piece
/// ends with a newline), so a worker that never prints a newline cannot make
/// the launcher buffer without bound.
pub(crate) const MAX_LINE: usize = 64 * 1024;

/// Where forwarded lines go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Stdout,
    Stderr,
}

impl Target {
    /// Writes one whole line while holding the stream's lock, so lines from
    /// different workers never interleave.
    fn write_line(self, line: &[u8]) -> io::Result<()> {
        match self {
            Target::Stdout => {
                let mut out = io::stdout().lock();
                out.write_all(line)?;
                out.flush()
            }
            Target::Stderr => {
                let mut err = io::stderr().lock();
                err.write_all(line)?;
                err.flush()
            }
        }
    }
}

/// The prefix for `rank`'s lines: `[rank R] `, or nothing.
pub(crate) fn prefix(rank: usize, enabled: bool) -> Vec<u8> {
    if enabled {
        format!("[rank {rank}] ").into_bytes()
    } else {
        Vec::new()
    }
}

/// Reads `reader` to its end and hands each line — `prefix`, the line's bytes
/// (not necessarily UTF-8), and a newline (added if the input lacked one) —
/// to `emit` in a single call.
///
/// Once `emit` fails (say, the launcher's stdout is a closed pipe) the rest of
/// the input is still read and discarded, so the worker never blocks on a
/// full pipe. Returns the first read error.
pub(crate) fn forward_lines<R, E>(mut reader: R, prefix: &[u8], mut emit: E) -> io::Result<()>
where
    R: BufRead,
    E: FnMut(&[u8]) -> io::Result<()>,
{
    let mut line = Vec::with_capacity(prefix.len() + 128);
    let mut emitting = true;
    loop {
        line.clear();
        line.extend_from_slice(prefix);
        let read = (&mut reader)
            .take(MAX_LINE as u64)
            .read_until(b'\n', &mut line)?;
        if read == 0 {
            return Ok(());
        }
        if line.last() != Some(&b'\n') {
            line.push(b'\n');
        }
        if emitting && emit(&line).is_err() {
            emitting = false;
        }
    }
}

/// Starts a thread forwarding `stream` to `target`; it sends `()` on `done`
/// when the stream is closed.
pub(crate) fn spawn_forwarder<S>(
    rank: usize,
    stream: S,
    target: Target,
    prefix: Vec<u8>,
    done: Sender<()>,
) -> io::Result<()>
where
    S: Read + Send + 'static,
{
    let name = match target {
        Target::Stdout => format!("kolo-rank{rank}-stdout"),
        Target::Stderr => format!("kolo-rank{rank}-stderr"),
    };
    thread::Builder::new().name(name).spawn(move || {
        let reader = BufReader::with_capacity(MAX_LINE, stream);
        // A read error just ends forwarding: the worker's exit status is what
        // the launcher reports.
        let _ = forward_lines(reader, &prefix, |line| target.write_line(line));
        let _ = done.send(());
    })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(input: &[u8], prefix: &[u8]) -> Vec<Vec<u8>> {
        let mut lines = Vec::new();
        forward_lines(input, prefix, |line| {
            lines.push(line.to_vec());
            Ok(())
        })
        .expect("in-memory reads do not fail");
        lines
    }

    #[test]
    fn prefixes_every_line() {
        let lines = collect(b"hello\nworld\n", &prefix(3, true));
        assert_eq!(
            lines,
            vec![b"[rank 3] hello\n".to_vec(), b"[rank 3] world\n".to_vec()]
        );
    }

    #[test]
    fn final_line_without_newline_is_printed() {
        let lines = collect(b"a\nno newline", &prefix(0, true));
        assert_eq!(
            lines,
            vec![b"[rank 0] a\n".to_vec(), b"[rank 0] no newline\n".to_vec()]
        );
    }

    #[test]
    fn empty_lines_and_empty_input() {
        assert!(collect(b"", &prefix(0, true)).is_empty());
        assert_eq!(
            collect(b"\n\n", b"> "),
            vec![b"> \n".to_vec(), b"> \n".to_vec()]
        );
    }

    #[test]
    fn no_prefix_passes_through() {
        let lines = collect(b"x\ny", &prefix(1, false));
        assert_eq!(lines, vec![b"x\n".to_vec(), b"y\n".to_vec()]);
    }

    #[test]
    fn non_utf8_bytes_are_kept() {
        let lines = collect(b"\xff\xfe bytes\n", &prefix(2, true));
        assert_eq!(lines, vec![b"[rank 2] \xff\xfe bytes\n".to_vec()]);
    }

    #[test]
    fn long_lines_are_split() {
        let input = vec![b'x'; MAX_LINE * 2 + 10];
        let lines = collect(&input, b"p ");
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0].len(), 2 + MAX_LINE + 1);
        assert_eq!(lines[2].len(), 2 + 10 + 1);
        assert!(lines
            .iter()
            .all(|l| l.starts_with(b"p ") && l.ends_with(b"\n")));
    }

    #[test]
    fn keeps_draining_after_write_error() {
        let mut calls = 0;
        let mut reader: &[u8] = b"1\n2\n3\n";
        forward_lines(&mut reader, b"", |_| {
            calls += 1;
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        })
        .expect("in-memory reads do not fail");
        assert_eq!(calls, 1);
        assert!(reader.is_empty(), "input must be drained");
    }
}
