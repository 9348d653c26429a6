//! Fonts for plot text, loaded from a file at run time (see [`super::FontSource`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use kolo_core::settings::{Env, ProcessEnv};
use plotters::style::{register_font, FontStyle};

use super::{PlotWarning, FAMILY, FONT_CANDIDATES, FONT_ENV, MAX_FONT_BYTES, NOT_FOUND};

/// Fonts loaded so far. plotters keeps registered fonts as `&'static [u8]`,
/// so each distinct file is read and leaked at most once per process, and a
/// file that failed is not retried.
#[derive(Default)]
pub(super) struct FontCache {
    current: Option<PathBuf>,
    loaded: HashMap<PathBuf, &'static [u8]>,
    failed: HashMap<PathBuf, String>,
}

static FONTS: Mutex<Option<FontCache>> = Mutex::new(None);

/// Makes `path` the font used for plot text, or says why it cannot be.
pub(super) fn load_font(path: &Path) -> std::result::Result<(), String> {
    let mut guard = FONTS.lock().unwrap_or_else(|p| p.into_inner());
    let cache = guard.get_or_insert_with(FontCache::default);
    if cache.current.as_deref() == Some(path) {
        return Ok(());
    }
    if let Some(why) = cache.failed.get(path) {
        return Err(why.clone());
    }
    let bytes = match cache.loaded.get(path) {
        Some(b) => *b,
        None => match read_font_file(path) {
            Ok(b) => {
                let b: &'static [u8] = Box::leak(b.into_boxed_slice());
                cache.loaded.insert(path.to_path_buf(), b);
                b
            }
            Err(why) => {
                if why != NOT_FOUND {
                    cache.failed.insert(path.to_path_buf(), why.clone());
                }
                return Err(why);
            }
        },
    };
    if register_font(FAMILY, FontStyle::Normal, bytes).is_err() {
        let why = "not a valid TrueType/OpenType font".to_string();
        cache.failed.insert(path.to_path_buf(), why.clone());
        return Err(why);
    }
    cache.current = Some(path.to_path_buf());
    Ok(())
}

pub(super) fn read_font_file(path: &Path) -> std::result::Result<Vec<u8>, String> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(NOT_FOUND.to_string()),
        Err(e) => return Err(e.to_string()),
    };
    if !meta.is_file() {
        return Err("not a regular file".to_string());
    }
    if meta.len() > MAX_FONT_BYTES {
        return Err(format!("larger than {} MiB", MAX_FONT_BYTES >> 20));
    }
    std::fs::read(path).map_err(|e| e.to_string())
}

/// Tries [`FONT_ENV`], then [`FONT_CANDIDATES`].
pub(super) fn load_any_font() -> std::result::Result<PathBuf, PlotWarning> {
    let mut tried = Vec::new();
    let env = ProcessEnv
        .lookup_os(FONT_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from);
    let candidates = env
        .into_iter()
        .chain(FONT_CANDIDATES.iter().map(PathBuf::from));
    for path in candidates {
        match load_font(&path) {
            Ok(()) => return Ok(path),
            Err(why) => tried.push((path, why)),
        }
    }
    Err(PlotWarning::NoFont { tried })
}
