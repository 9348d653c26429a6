//! `kolo simulate`'s model: cluster descriptions, predictions on synthetic and published profiles.

use kolo_train::simulate::{
    predict, predict_all, published, Cluster, ParamProfile, Profile, RawCluster, SimError,
};

fn cluster(json: &str) -> Result<Cluster, SimError> {
    RawCluster::from_json(json, "test")?.validate()
}

fn field_of(e: SimError) -> String {
    match e {
        SimError::Cluster { field, .. } => field,
        other => format!("not a cluster error: {other}"),
    }
}

const GOOD: &str = r#"{"ranks_per_node": 4, "intra_node": {"bandwidth_gbps": 80, "latency_us": 5},
    "inter_node": {"bandwidth_gbps": 25, "latency_us": 10}, "algorithm": "ring", "bucket_mb": 1}"#;

#[test]
fn bad_descriptions_name_the_field() {
    assert!(cluster(GOOD).is_ok());
    let cases = [
        (r#"{"intra_node": {"bandwidth_gbps": 1}}"#, "ranks_per_node"),
        (
            r#"{"ranks_per_node": 0, "intra_node": {"bandwidth_gbps": 1}}"#,
            "ranks_per_node",
        ),
        (r#"{"ranks_per_node": 2}"#, "intra_node"),
        (
            r#"{"ranks_per_node": 2, "intra_node": {"bandwidth_gbps": -3}}"#,
            "intra_node.bandwidth_gbps",
        ),
        (
            r#"{"ranks_per_node": 2, "intra_node": {"bandwidth_bytes_per_s": 0}}"#,
            "intra_node.bandwidth_bytes_per_s",
        ),
        (
            r#"{"ranks_per_node": 2, "intra_node": {"latency_us": 3}}"#,
            "intra_node.bandwidth_gbps",
        ),
        (
            r#"{"ranks_per_node": 2, "intra_node": {"bandwidth_gbps": 1},
                "inter_node": {"bandwidth_gbps": 1, "latency_us": -1}}"#,
            "inter_node.latency_us",
        ),
        (
            r#"{"ranks_per_node": 2, "intra_node": {"bandwidth_gbps": 1}, "algorithm": "magic"}"#,
            "algorithm",
        ),
        (
            r#"{"ranks_per_node": 2, "intra_node": {"bandwidth_gbps": 1}, "bucket_mb": 0}"#,
            "bucket_mb",
        ),
        (
            r#"{"ranks_per_node": 2, "intra_node": {"bandwidth_gbps": 1}, "threads_per_rank": 0}"#,
            "threads_per_rank",
        ),
    ];
    for (json, field) in cases {
        let got = cluster(json).map(|_| ()).map_err(field_of);
        assert_eq!(got, Err(field.to_string()), "{json}");
    }
    // Unknown fields are refused by the parser, naming the field.
    let e = RawCluster::from_json(r#"{"ranks_per_nodes": 2}"#, "test").map(|_| ());
    assert!(
        matches!(e, Err(SimError::Parse { ref source, .. }) if source.to_string().contains("ranks_per_nodes"))
    );
    // Worlds that do not fit.
    let one_node = cluster(r#"{"ranks_per_node": 2, "intra_node": {"bandwidth_gbps": 1}}"#);
    let one_node = one_node.map_err(field_of);
    assert!(one_node.is_ok());
    if let Ok(c) = one_node {
        assert_eq!(
            c.placement(4).map_err(field_of),
            Err("inter_node".to_string())
        );
        assert_eq!(c.placement(0).map_err(field_of), Err("ranks".to_string()));
    }
}

/// Two parameters of 1 M elements (4 MB each, one bucket each), backward 1 s, the first (in
/// backward order: the last parameter) ready at 0.5 s, the other at 1 s.
fn synthetic() -> Profile {
    Profile {
        model: "synthetic".into(),
        batch: 10,
        threads: 1,
        forward_s: 0.5,
        backward_s: 1.0,
        optimizer_s: 0.1,
        other_s: 0.0,
        elem_bytes: 4,
        gamma_s_per_byte: 0.0,
        step_sd_s: 0.0,
        params: vec![
            ParamProfile {
                name: "a".into(),
                numel: 1 << 20,
                ready_s: 1.0,
            },
            ParamProfile {
                name: "b".into(),
                numel: 1 << 20,
                ready_s: 0.5,
            },
        ],
        method: "test".into(),
    }
}

fn ring_cluster(gbytes_per_s: f64, overlap: bool) -> Result<Cluster, SimError> {
    let json = format!(
        r#"{{"ranks_per_node": 8, "intra_node": {{"bandwidth_bytes_per_s": {}}},
            "algorithm": "ring", "bucket_mb": 4, "overlap": {overlap},
            "scalar_allreduces_per_step": 0}}"#,
        gbytes_per_s * 1e9
    );
    cluster(&json)
}

#[test]
fn one_rank_is_fully_efficient_and_pays_no_communication() -> Result<(), SimError> {
    let p = synthetic();
    let c = ring_cluster(1.0, true)?;
    let all = predict_all(&p, &c, &[1, 2, 4])?;
    assert_eq!(all[0].efficiency, 1.0);
    assert_eq!(all[0].comm_s, 0.0);
    assert!((all[0].step_s - 1.6).abs() < 1e-12);
    assert!(all.iter().all(|x| x.efficiency <= 1.0 + 1e-12));
    Ok(())
}

#[test]
fn overlap_hides_or_exposes_by_hand() -> Result<(), SimError> {
    let p = synthetic();
    // 4 ranks, ring, α = 0: each 4 MiB bucket takes 2·3/4·4 MiB·β.
    let s = f64::from(4u32 << 20);
    for (gb, overlap) in [(1.0, true), (0.01, true), (1.0, false)] {
        let c = ring_cluster(gb, overlap)?;
        let t = 1.5 * s / (gb * 1e9);
        let got = predict(&p, &c, 4)?;
        // Bucket 0 (parameter b) ready at 0.5, bucket 1 at 1.0.
        let end = if overlap {
            (0.5 + t).max(1.0) + t
        } else {
            1.0 + 2.0 * t
        };
        let exposed = end - 1.0;
        assert!(
            (got.exposed_s - exposed).abs() < 1e-9,
            "{gb} {overlap}: {got:?}"
        );
        assert!((got.step_s - (1.6 + exposed)).abs() < 1e-9);
        assert!((got.comm_s - 2.0 * t).abs() < 1e-9);
        assert_eq!(got.buckets, 2);
    }
    // Fast link: the first bucket (12.6 ms) hides behind the remaining 0.5 s of backward.
    let fast = predict(&p, &ring_cluster(1.0, true)?, 4)?;
    assert!((fast.exposed_s - 1.5 * s / 1e9).abs() < 1e-9);
    Ok(())
}

#[test]
fn oversubscription_slows_compute() -> Result<(), SimError> {
    let c = cluster(
        r#"{"ranks_per_node": 8, "intra_node": {"bandwidth_gbps": 1000}, "cores_per_node": 2,
            "threads_per_rank": 1, "scalar_allreduces_per_step": 0}"#,
    )?;
    let p = synthetic();
    let two = predict(&p, &c, 2)?;
    assert_eq!(two.compute_s, 1.6);
    assert!(two.exposed_s < 1e-4);
    let eight = predict(&p, &c, 8)?;
    assert!((eight.compute_s - 6.4).abs() < 1e-12);
    // Two buckets (Ddp's first holds at most 1 MiB), no scalar all-reduce: 2 syncs × 7 waiting
    // ranks × 1 ms of spinning / 2 cores = 7 ms, plus the (tiny) all-reduces.
    assert_eq!(eight.buckets, 2);
    assert!((eight.exposed_s - 7e-3).abs() < 4e-4, "{eight:?}");
    Ok(())
}

fn horovod() -> Result<Cluster, SimError> {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/horovod-25gbe.json"
    );
    RawCluster::load(std::path::Path::new(path))?.validate()
}

#[test]
fn vgg16_scales_worse_than_resnet101() -> Result<(), SimError> {
    let c = horovod()?;
    let ranks = [8, 128, 512];
    let eff = |name: &str| -> Result<Vec<f64>, SimError> {
        let p = published::builtin(name)?;
        Ok(predict_all(&p, &c, &ranks)?
            .iter()
            .map(|x| x.efficiency)
            .collect())
    };
    let (resnet, inception, vgg) = (eff("resnet101")?, eff("inception-v3")?, eff("vgg16")?);
    assert!(
        resnet[1] > 0.85 && inception[1] > 0.85,
        "{resnet:?} {inception:?}"
    );
    // VGG-16 sends 3× ResNet-101's gradients for about the same compute: it falls behind, and
    // further behind as the ring grows.
    assert!(vgg[1] < resnet[1] - 0.04, "vgg {vgg:?} resnet {resnet:?}");
    assert!(vgg[2] < resnet[2] - 0.07, "vgg {vgg:?} resnet {resnet:?}");
    assert!(vgg[0] - vgg[2] > 2.0 * (resnet[0] - resnet[2]));
    // Without overlap, VGG-16's communication is all exposed.
    let mut serial = c.clone();
    serial.overlap = false;
    let p = published::builtin("vgg16")?;
    let no_overlap = predict_all(&p, &serial, &[128])?;
    assert!(no_overlap[0].efficiency < 0.6, "{no_overlap:?}");
    let total = published::builtin("vgg16")?.gradient_bytes() / 4;
    assert!((138_000_000..139_000_000).contains(&total), "{total}");
    assert!(published::builtin("alexnet").is_err());
    Ok(())
}

#[test]
fn jitter_costs_the_expected_maximum() -> Result<(), SimError> {
    use kolo_train::simulate::predict::expected_max_normal;
    assert_eq!(expected_max_normal(1), 0.0);
    assert!((expected_max_normal(2) - 0.5642).abs() < 1e-4);
    // Blom's approximation beyond the table, increasing.
    let (e9, e100) = (expected_max_normal(9), expected_max_normal(100));
    assert!(e9 > 1.4236 && e9 < 1.55, "{e9}");
    assert!((e100 - 2.5076).abs() < 0.03, "{e100}");
    let mut p = synthetic();
    p.step_sd_s = 0.1;
    let c = ring_cluster(1e6, true)?;
    let one = predict(&p, &c, 1)?;
    let two = predict(&p, &c, 2)?;
    assert_eq!(one.exposed_s, 0.0);
    assert!(two.exposed_s >= 0.05642 - 1e-9);
    Ok(())
}
