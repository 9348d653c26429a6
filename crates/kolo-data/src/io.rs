//! File reading shared by the loaders: whole-file reads with transparent
//! gzip decompression detected by content, not by file name.

use std::io::Read;
use std::path::Path;

use flate2::read::MultiGzDecoder;

use crate::error::DataError;

/// The two magic bytes that open every gzip member.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Most bytes a gzip file may decompress to (the largest real data set file,
/// CIFAR-10's, is 31 MB): a small corrupt or hostile file cannot make a
/// loader allocate without bound.
pub(crate) const MAX_DECOMPRESSED: u64 = 1 << 30;

/// Reads `path` into memory, decompressing it if it starts with the gzip
/// magic bytes `1f 8b`.
pub(crate) fn read_maybe_gz(path: &Path) -> Result<Vec<u8>, DataError> {
    let raw = std::fs::read(path).map_err(|source| DataError::Io {
        path: path.to_owned(),
        source,
    })?;
    decode_maybe_gz(path, raw, MAX_DECOMPRESSED)
}

/// The contents of a file read from `path`: `raw` itself, or its gzip
/// decompression (at most `limit` bytes) if it starts with the gzip magic.
pub(crate) fn decode_maybe_gz(path: &Path, raw: Vec<u8>, limit: u64) -> Result<Vec<u8>, DataError> {
    if !raw.starts_with(&GZIP_MAGIC) {
        return Ok(raw);
    }
    // ISIZE (the last 4 bytes) is the uncompressed size mod 2^32 of the last
    // member: a good capacity hint for single-member files, capped so a
    // hostile header cannot make us allocate much up front.
    let hint = raw
        .get(raw.len().saturating_sub(4)..)
        .and_then(|t| <[u8; 4]>::try_from(t).ok())
        .map_or(0, |b| u64::from(u32::from_le_bytes(b)))
        .min(limit.min(1 << 30));
    let mut out = Vec::with_capacity(usize::try_from(hint).unwrap_or(0));
    // One byte past the limit tells a file at the limit from one beyond it.
    MultiGzDecoder::new(raw.as_slice())
        .take(limit.saturating_add(1))
        .read_to_end(&mut out)
        .map_err(|e| DataError::format(path, format!("corrupt gzip data: {e}")))?;
    if out.len() as u64 > limit {
        return Err(DataError::format(
            path,
            format!("decompresses to more than {limit} bytes: not a data set file"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use flate2::write::GzEncoder;
    use flate2::Compression;
    use std::io::Write;

    #[test]
    fn reads_plain_and_gzip_by_content() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let plain = dir.path().join("a.gz"); // misleading name on purpose
        std::fs::write(&plain, b"hello")?;
        assert_eq!(read_maybe_gz(&plain)?, b"hello");

        let gz = dir.path().join("b.bin");
        let mut enc = GzEncoder::new(Vec::new(), Compression::fast());
        enc.write_all(b"world")?;
        std::fs::write(&gz, enc.finish()?)?;
        assert_eq!(read_maybe_gz(&gz)?, b"world");
        Ok(())
    }

    #[test]
    fn corrupt_gzip_and_missing_file_name_the_path() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let bad = dir.path().join("bad");
        std::fs::write(&bad, [0x1f, 0x8b, 8, 0, 0, 0])?;
        match read_maybe_gz(&bad) {
            Err(DataError::Format { path, .. }) => assert_eq!(path, bad),
            other => panic!("expected Format, got {other:?}"),
        }
        let missing = dir.path().join("missing");
        match read_maybe_gz(&missing) {
            Err(DataError::Io { path, .. }) => assert_eq!(path, missing),
            other => panic!("expected Io, got {other:?}"),
        }
        Ok(())
    }

    #[test]
    fn decompression_is_bounded() -> Result<(), Box<dyn std::error::Error>> {
        let mut enc = GzEncoder::new(Vec::new(), Compression::best());
        enc.write_all(&[0u8; 4096])?;
        let gz = enc.finish()?;
        let path = Path::new("zeros.gz");
        assert_eq!(decode_maybe_gz(path, gz.clone(), 4096)?.len(), 4096);
        match decode_maybe_gz(path, gz, 4095) {
            Err(DataError::Format { path: p, reason }) => {
                assert_eq!(p, path);
                assert!(reason.contains("more than 4095 bytes"), "{reason}");
            }
            other => panic!("expected Format, got {other:?}"),
        }
        Ok(())
    }
}
