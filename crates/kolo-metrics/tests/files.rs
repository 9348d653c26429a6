//! Metrics CSV, TensorBoard event files and run directories, end to end.

use std::path::Path;

use kolo_metrics::{
    crc32c, masked_crc32c, read_csv, MetricsCsv, MetricsError, RunDir, TensorBoardWriter,
    FILE_VERSION, TRAINING_COLUMNS,
};

#[test]
fn csv_write_append_read_roundtrip() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("metrics.csv");
    let rows = [
        [1.0, 100.0, 0.5, 0.45, 0.9, 12.5, 8000.25, 0.1],
        [2.0, 200.0, 0.25, 0.3, 0.95, 12.0, 8100.0, 0.05],
        [3.0, 300.0, 1.0 / 3.0, f64::NAN, 0.96, 11.9, 8200.0, 1e-7],
    ];
    {
        let mut csv = MetricsCsv::create(&path, &TRAINING_COLUMNS).expect("create");
        csv.append(&rows[0]).expect("append");
        csv.append(&rows[1]).expect("append");
        // Wrong number of values: rejected, nothing written.
        match csv.append(&[1.0, 2.0]) {
            Err(MetricsError::Columns { expected, got, .. }) => {
                assert_eq!((expected, got), (8, 2));
            }
            other => panic!("expected Columns error, got {other:?}"),
        }
        // Dropped without any explicit flush: rows must already be on disk.
    }
    let text = std::fs::read_to_string(&path).expect("read");
    assert_eq!(
        text.lines().next(),
        Some("epoch,step,train_loss,test_loss,test_accuracy,epoch_seconds,samples_per_second,learning_rate")
    );
    assert!(
        text.contains("\n1,100,0.5,0.45,0.9,12.5,8000.25,0.1\n"),
        "{text}"
    );

    // Resume and append the third row.
    {
        let mut csv = MetricsCsv::open_append(&path, &TRAINING_COLUMNS).expect("open_append");
        csv.append(&rows[2]).expect("append");
    }
    let (columns, read) = read_csv(&path).expect("read_csv");
    assert_eq!(columns, TRAINING_COLUMNS);
    assert_eq!(read.len(), 3);
    for (got, want) in read.iter().zip(rows.iter()) {
        for (g, w) in got.iter().zip(want.iter()) {
            assert!(g == w || (g.is_nan() && w.is_nan()), "{got:?} vs {want:?}");
        }
    }
}

#[test]
fn csv_rows_survive_without_drop() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("m.csv");
    let mut csv = MetricsCsv::create(&path, &["epoch", "loss"]).expect("create");
    csv.append(&[1.0, 0.5]).expect("append");
    // Read while the writer is still alive (as a killed process would leave it).
    let (_, rows) = read_csv(&path).expect("read");
    assert_eq!(rows, vec![vec![1.0, 0.5]]);
    std::mem::forget(csv);
}

#[test]
fn csv_resume_header_mismatch_names_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("metrics.csv");
    MetricsCsv::create(&path, &["epoch", "loss"]).expect("create");
    let err = MetricsCsv::open_append(&path, &["epoch", "loss", "acc"]).expect_err("mismatch");
    match &err {
        MetricsError::HeaderMismatch {
            path: p,
            expected,
            found,
        } => {
            assert_eq!(p, &path);
            assert_eq!(expected, "epoch,loss,acc");
            assert_eq!(found, "epoch,loss");
        }
        other => panic!("expected HeaderMismatch, got {other:?}"),
    }
    assert!(err.to_string().contains("metrics.csv"), "{err}");
}

#[test]
fn csv_resume_repairs_cut_off_row_and_creates_missing() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let path = tmp.path().join("m.csv");
    std::fs::write(&path, "epoch,loss\n1,0.5\n2,0.4").expect("write");
    let mut csv = MetricsCsv::open_append(&path, &["epoch", "loss"]).expect("open");
    csv.append(&[2.0, 0.375]).expect("append");
    let (_, rows) = read_csv(&path).expect("read");
    assert_eq!(rows, vec![vec![1.0, 0.5], vec![2.0, 0.375]]);

    // Missing file: created with header.
    let fresh = tmp.path().join("new.csv");
    let mut csv = MetricsCsv::open_append(&fresh, &["a"]).expect("open missing");
    csv.append(&[7.0]).expect("append");
    assert_eq!(std::fs::read_to_string(&fresh).expect("read"), "a\n7\n");

    // Header only, without newline.
    let bare = tmp.path().join("bare.csv");
    std::fs::write(&bare, "a").expect("write");
    let mut csv = MetricsCsv::open_append(&bare, &["a"]).expect("open bare");
    csv.append(&[1.0]).expect("append");
    assert_eq!(std::fs::read_to_string(&bare).expect("read"), "a\n1\n");
}

#[test]
fn csv_errors_name_the_file() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let missing = tmp.path().join("nope").join("m.csv");
    let err = MetricsCsv::create(&missing, &["a"]).expect_err("no dir");
    assert!(matches!(err, MetricsError::Io { ref path, .. } if path == &missing));
    assert!(err.to_string().contains("nope"), "{err}");

    let bad = tmp.path().join("bad.csv");
    std::fs::write(&bad, "a,b\n1,2\n3,x\n").expect("write");
    match read_csv(&bad) {
        Err(MetricsError::Csv { path, line, .. }) => {
            assert_eq!(path, bad);
            assert_eq!(line, 3);
        }
        other => panic!("expected Csv error, got {other:?}"),
    }
    assert!(matches!(
        MetricsCsv::create(&tmp.path().join("c.csv"), &["a", "a"]),
        Err(MetricsError::InvalidColumn { .. })
    ));
}

#[test]
fn crc32c_known_vector() {
    assert_eq!(crc32c(b"123456789"), 0xE306_9283);
    // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, computed by hand.
    assert_eq!(masked_crc32c(b"123456789"), 0xC78A_B0E5);
}

// ---- A minimal TFRecord + protobuf decoder for the checks below. ----

#[derive(Debug, Default, PartialEq)]
struct Event {
    wall_time: f64,
    step: i64,
    file_version: Option<String>,
    values: Vec<(String, f32)>,
}

fn read_records(bytes: &[u8]) -> Vec<Vec<u8>> {
    let mut records = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let len_bytes: [u8; 8] = bytes[pos..pos + 8].try_into().expect("len");
        let len = u64::from_le_bytes(len_bytes) as usize;
        let len_crc = u32::from_le_bytes(bytes[pos + 8..pos + 12].try_into().expect("crc"));
        assert_eq!(len_crc, masked_crc32c(&len_bytes), "length CRC at {pos}");
        let data = &bytes[pos + 12..pos + 12 + len];
        let data_crc = u32::from_le_bytes(
            bytes[pos + 12 + len..pos + 16 + len]
                .try_into()
                .expect("crc"),
        );
        assert_eq!(data_crc, masked_crc32c(data), "data CRC at {pos}");
        records.push(data.to_vec());
        pos += 16 + len;
    }
    assert_eq!(pos, bytes.len(), "trailing bytes");
    records
}

fn varint(buf: &[u8], pos: &mut usize) -> u64 {
    let mut v = 0u64;
    let mut shift = 0;
    loop {
        let b = buf[*pos];
        *pos += 1;
        v |= u64::from(b & 0x7F) << shift;
        if b & 0x80 == 0 {
            return v;
        }
        shift += 7;
    }
}

/// Iterates (field, wire type, payload) over a protobuf message.
fn fields(buf: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < buf.len() {
        let key = varint(buf, &mut pos);
        let (field, wire) = (key >> 3, key & 7);
        let payload = match wire {
            0 => varint(buf, &mut pos).to_le_bytes().to_vec(),
            1 => {
                pos += 8;
                buf[pos - 8..pos].to_vec()
            }
            2 => {
                let len = varint(buf, &mut pos) as usize;
                pos += len;
                buf[pos - len..pos].to_vec()
            }
            5 => {
                pos += 4;
                buf[pos - 4..pos].to_vec()
            }
            w => panic!("unexpected wire type {w}"),
        };
        out.push((field, wire, payload));
    }
    out
}

fn decode_event(buf: &[u8]) -> Event {
    let mut ev = Event::default();
    for (field, wire, p) in fields(buf) {
        match (field, wire) {
            (1, 1) => ev.wall_time = f64::from_le_bytes(p.try_into().expect("f64")),
            (2, 0) => ev.step = i64::from_le_bytes(p.try_into().expect("i64")),
            (3, 2) => ev.file_version = Some(String::from_utf8(p).expect("utf8")),
            (5, 2) => {
                for (vf, vw, value) in fields(&p) {
                    assert_eq!((vf, vw), (1, 2), "Summary.value");
                    let mut tag = String::new();
                    let mut simple = f32::NAN;
                    for (f, w, x) in fields(&value) {
                        match (f, w) {
                            (1, 2) => tag = String::from_utf8(x).expect("utf8"),
                            (2, 5) => simple = f32::from_le_bytes(x.try_into().expect("f32")),
                            other => panic!("unexpected Value field {other:?}"),
                        }
                    }
                    ev.values.push((tag, simple));
                }
            }
            other => panic!("unexpected Event field {other:?}"),
        }
    }
    ev
}

#[test]
fn tensorboard_event_file_roundtrip() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("tb");
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs_f64();
    let mut w = TensorBoardWriter::create(&dir).expect("create");
    let name = w
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_string();
    assert!(name.starts_with("events.out.tfevents."), "{name}");
    w.add_scalar("loss/train", 0.75, 1).expect("add");
    w.add_scalar("loss/train", 0.5, 2).expect("add");
    w.add_scalar("accuracy/test", 0.9, -3).expect("add");
    w.add_scalars(1_000_000_000_000, &[("a", 1.0), ("b", -2.5)])
        .expect("add");
    w.flush().expect("flush");

    let bytes = std::fs::read(w.path()).expect("read");
    let events: Vec<Event> = read_records(&bytes)
        .iter()
        .map(|r| decode_event(r))
        .collect();
    assert_eq!(events.len(), 5);
    assert_eq!(events[0].file_version.as_deref(), Some(FILE_VERSION));
    assert!(events[0].values.is_empty());
    for ev in &events {
        assert!(ev.wall_time >= before - 1.0 && ev.wall_time < before + 60.0);
    }
    let scalars: Vec<(i64, Vec<(String, f32)>)> = events[1..]
        .iter()
        .map(|e| (e.step, e.values.clone()))
        .collect();
    assert_eq!(
        scalars,
        vec![
            (1, vec![("loss/train".to_string(), 0.75)]),
            (2, vec![("loss/train".to_string(), 0.5)]),
            (-3, vec![("accuracy/test".to_string(), 0.9)]),
            (
                1_000_000_000_000,
                vec![("a".to_string(), 1.0), ("b".to_string(), -2.5)]
            ),
        ]
    );

    // A second writer in the same directory and second gets its own file.
    let w2 = TensorBoardWriter::create(&dir).expect("second");
    assert_ne!(w2.path(), w.path());
    drop(w2);
    let first = std::fs::read(w.path()).expect("read");
    assert_eq!(first, bytes, "second writer must not touch the first file");
}

#[test]
fn tensorboard_file_is_valid_right_after_create() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let w = TensorBoardWriter::create(tmp.path()).expect("create");
    let bytes = std::fs::read(w.path()).expect("read");
    let records = read_records(&bytes);
    assert_eq!(records.len(), 1);
    assert_eq!(
        decode_event(&records[0]).file_version.as_deref(),
        Some("brain.Event:2")
    );
}

#[test]
fn tensorboard_create_error_names_dir() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").expect("write");
    let err = TensorBoardWriter::create(&file.join("tb")).expect_err("must fail");
    assert!(err.to_string().contains("not-a-dir"), "{err}");
}

#[test]
fn rundir_fresh_and_explicit() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let base = tmp.path().join("runs");
    let a = RunDir::create(None, &base, "mnist mlp").expect("a");
    let b = RunDir::create(None, &base, "mnist mlp").expect("b");
    assert_ne!(a.path(), b.path());
    assert!(a.path().is_dir() && b.path().is_dir());
    let name = a
        .path()
        .file_name()
        .and_then(|n| n.to_str())
        .expect("name")
        .to_string();
    // mnist-mlp-YYYYmmdd-HHMMSS
    let stamp = name.strip_prefix("mnist-mlp-").expect("prefix");
    assert_eq!(stamp.len(), 15, "{name}");
    assert_eq!(stamp.as_bytes()[8], b'-');
    assert!(stamp
        .chars()
        .enumerate()
        .all(|(i, c)| i == 8 || c.is_ascii_digit()));
    assert!(stamp.starts_with("20"), "{stamp}");

    let explicit = tmp.path().join("deep").join("out");
    let r = RunDir::create(Some(&explicit), &base, "ignored").expect("explicit");
    assert_eq!(r.path(), explicit.as_path());
    assert!(explicit.is_dir());
    // Reusing an existing explicit directory (resume) is fine.
    let again = RunDir::create(Some(&explicit), &base, "ignored").expect("reuse");
    assert_eq!(again, r);

    assert_eq!(r.metrics_csv(), explicit.join("metrics.csv"));
    assert_eq!(r.plot_png(), explicit.join("training.png"));
    assert_eq!(r.tensorboard_dir(), explicit.join("tensorboard"));
    assert_eq!(r.checkpoint_dir(), explicit.join("checkpoints"));
    assert_eq!(r.summary_json(), explicit.join("summary.json"));
    assert!(!Path::new(&r.checkpoint_dir()).exists());
}
