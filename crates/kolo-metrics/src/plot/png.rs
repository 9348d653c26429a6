//! Writing a PNG whole: encoded to a temporary file, then renamed into place.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::error::{MetricsError, Result};

pub(super) fn write_png_atomically(path: &Path, rgb: &[u8], w: u32, h: u32) -> Result<()> {
    let file_name = path.file_name().ok_or_else(|| MetricsError::Plot {
        path: path.to_path_buf(),
        reason: "path has no file name".to_string(),
    })?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(file_name);
    tmp_name.push(format!(".{}.tmp", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let result = encode_png(&tmp, rgb, w, h)
        .and_then(|()| std::fs::rename(&tmp, path).map_err(|e| MetricsError::io(path, e)));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

pub(super) fn encode_png(tmp: &Path, rgb: &[u8], w: u32, h: u32) -> Result<()> {
    let file = File::create(tmp).map_err(|e| MetricsError::io(tmp, e))?;
    let mut out = BufWriter::new(file);
    let png_err = |e: png::EncodingError| match e {
        png::EncodingError::IoError(io) => MetricsError::io(tmp, io),
        other => MetricsError::Plot {
            path: tmp.to_path_buf(),
            reason: other.to_string(),
        },
    };
    {
        let mut encoder = png::Encoder::new(&mut out, w, h);
        encoder.set_color(png::ColorType::Rgb);
        encoder.set_depth(png::BitDepth::Eight);
        let mut writer = encoder.write_header().map_err(png_err)?;
        writer.write_image_data(rgb).map_err(png_err)?;
        writer.finish().map_err(png_err)?;
    }
    out.flush().map_err(|e| MetricsError::io(tmp, e))?;
    Ok(())
}
