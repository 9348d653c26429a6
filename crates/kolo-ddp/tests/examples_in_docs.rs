//! The README's training loop is the compiled example's: the block after the README's marker
//! equals the `ANCHOR: loop` region of `examples/ddp_minimal.rs` (dedented), so the README cannot
//! show code that no longer compiles; and the book's chapters show that region by including it
//! (mdBook's `{{#include ...:loop}}`), not by a copy. (The suite runs the example itself under
//! `kolo run -n 2`: `scripts/e2e-examples.sh`; `scripts/check-book.py` checks every other include
//! and copy.)

use std::path::Path;

const MARKER: &str = "<!-- the ANCHOR: loop region of crates/kolo-ddp/examples/ddp_minimal.rs -->";

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines between `// ANCHOR: NAME` and `// ANCHOR_END: NAME` (mdBook's include anchors),
/// without their common indentation.
fn anchored(text: &str, name: &str) -> String {
    let start = format!("// ANCHOR: {name}");
    let end = format!("// ANCHOR_END: {name}");
    let lines: Vec<&str> = text
        .lines()
        .skip_while(|l| l.trim() != start)
        .skip(1)
        .take_while(|l| l.trim() != end)
        .collect();
    assert!(!lines.is_empty(), "no ANCHOR: {name} region");
    let indent = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    lines
        .iter()
        .map(|l| l.get(indent..).unwrap_or("").trim_end())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn readme_loop_is_the_compiled_example() {
    let readme = read("../../README.md");
    let at = readme
        .find(MARKER)
        .expect("README.md has the ddp_minimal marker");
    let block: Vec<&str> = readme[at..]
        .lines()
        .skip(2) // the marker and the opening fence
        .take_while(|l| !l.starts_with("```"))
        .collect();
    let example = anchored(&read("examples/ddp_minimal.rs"), "loop");
    assert_eq!(
        block.join("\n"),
        example,
        "README.md's loop differs from ddp_minimal.rs"
    );
    let lines = example.lines().count();
    assert!(lines <= 40, "the loop has {lines} lines (at most 40)");
    assert!(
        example.starts_with("let comm = kolo::init()?;"),
        "{example}"
    );
}

#[test]
fn the_book_includes_the_loop_from_the_example() {
    const INCLUDE: &str = "crates/kolo-ddp/examples/ddp_minimal.rs:loop}}";
    for chapter in ["getting-started.md", "loop/index.md"] {
        let text = read(&format!("../../docs/src/{chapter}"));
        let at = text
            .find(INCLUDE)
            .unwrap_or_else(|| panic!("docs/src/{chapter} does not include {INCLUDE}"));
        let line = text[..at].rsplit('\n').next().unwrap_or("");
        assert!(
            line.starts_with("{{#include ") && line.ends_with("../"),
            "docs/src/{chapter}: the include of {INCLUDE} is not on a line of its own: {line}"
        );
    }
    assert!(
        !anchored(&read("examples/ddp_minimal.rs"), "loop").is_empty(),
        "the example has its loop region"
    );
}
