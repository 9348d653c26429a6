//! Fonts for plot text, loaded from a file at run time (see [`super::FontSource`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

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
    let env = std::env::var_os(FONT_ENV)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_steps() {
        assert_eq!(nice_step(10.0, 10), 1.0);
        assert_eq!(nice_step(30.0, 10), 5.0);
        assert_eq!(nice_step(0.9, 8), 0.2);
        assert!((nice_step(0.05, 8) - 0.01).abs() < 1e-12);
    }

    #[test]
    fn epoch_ticks_are_integers() {
        let pts: Vec<(f64, f64)> = (1..=7).map(|e| (f64::from(e), 1.0)).collect();
        let (ticks, range) = x_axis(&pts);
        assert_eq!(ticks, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]);
        assert!(range.start < 1.0 && range.end > 7.0);
        let pts: Vec<(f64, f64)> = (0..100).map(|e| (f64::from(e), 1.0)).collect();
        let (ticks, _) = x_axis(&pts);
        assert_eq!(ticks.first(), Some(&0.0));
        assert_eq!(ticks.get(1), Some(&10.0));
        // A single epoch still gives a usable axis.
        let (ticks, range) = x_axis(&[(3.0, 1.0)]);
        assert!(ticks.contains(&3.0) && range.start < 3.0 && range.end > 3.0);
    }

    #[test]
    fn accuracy_axis_fraction_and_percent() {
        let pts = [(1.0, 0.90), (2.0, 0.95), (3.0, 0.97)];
        let (ticks, range, decimals) = accuracy_axis(&pts, 100.0);
        assert!(range.start >= 0.0 && range.end <= 1.0);
        assert!(range.start < 0.90 && range.end > 0.97);
        assert!(!ticks.is_empty());
        assert_eq!(decimals, 0);
        let (_, range, _) = accuracy_axis(&[(1.0, 50.0), (2.0, 99.9)], 1.0);
        assert!(range.end <= 100.0 && range.start < 50.0);
    }

    #[test]
    fn number_format() {
        assert_eq!(fmt_number(&3.0), "3");
        assert_eq!(fmt_number(&0.25), "0.25");
        assert_eq!(fmt_number(&0.0), "0");
        assert_eq!(fmt_number(&1.5e-4), "1.5e-4");
    }

    #[test]
    fn warning_messages() {
        let w = PlotWarning::NoFont {
            tried: vec![
                (PathBuf::from("/a.ttf"), NOT_FOUND.to_string()),
                (PathBuf::from("/b.ttf"), "not a valid font".to_string()),
            ],
        };
        let s = w.to_string();
        assert!(s.contains("/b.ttf: not a valid font"), "{s}");
        assert!(!s.contains("/a.ttf"), "{s}");
        assert!(s.contains(FONT_ENV));
    }
}
