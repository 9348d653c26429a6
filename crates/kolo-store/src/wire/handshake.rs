//! The handshake that opens every connection: `MAGIC` and `PROTOCOL_VERSION`, both ways.

use std::io::{Read, Write};

use super::{invalid, WireError, MAGIC, PROTOCOL_VERSION};

/// Client side of the handshake: sends `MAGIC` and `PROTOCOL_VERSION`,
/// expects the same back.
///
/// The job-secret exchange ([`crate::auth`]) follows it.
pub(crate) fn client_handshake<S: Read + Write>(stream: &mut S) -> Result<(), WireError> {
    stream.write_all(&hello())?;
    stream.flush()?;
    let (magic, version) = read_hello(stream)?;
    if magic != MAGIC {
        return Err(invalid(format!(
            "peer answered the handshake with magic {magic:#010x} instead of {MAGIC:#010x}: \
             it is not a kolo store server"
        )));
    }
    if version != PROTOCOL_VERSION {
        return Err(invalid(format!(
            "server speaks store protocol version {version}, this client speaks {PROTOCOL_VERSION}"
        )));
    }
    Ok(())
}

/// Server side of the handshake: expects `MAGIC` and `PROTOCOL_VERSION`
/// and answers with its own. On a version mismatch it still answers (so
/// the client can report the versions) and then fails.
/// The job-secret exchange ([`crate::auth`]) follows it.
pub(crate) fn server_handshake<S: Read + Write>(stream: &mut S) -> Result<(), WireError> {
    let (magic, version) = read_hello(stream)?;
    if magic != MAGIC {
        return Err(invalid(format!(
            "bad handshake magic {magic:#010x} (expected {MAGIC:#010x}): not a kolo store client"
        )));
    }
    stream.write_all(&hello())?;
    stream.flush()?;
    if version != PROTOCOL_VERSION {
        return Err(invalid(format!(
            "client speaks store protocol version {version}, this server speaks {PROTOCOL_VERSION}"
        )));
    }
    Ok(())
}

pub(super) fn hello() -> [u8; 6] {
    let mut out = [0u8; 6];
    out[..4].copy_from_slice(&MAGIC.to_le_bytes());
    out[4..].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
    out
}

fn read_hello<R: Read>(r: &mut R) -> Result<(u32, u16), WireError> {
    let mut buf = [0u8; 6];
    r.read_exact(&mut buf)?;
    let magic = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let version = u16::from_le_bytes([buf[4], buf[5]]);
    Ok((magic, version))
}
