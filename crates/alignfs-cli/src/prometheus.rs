//! A volume's report in the Prometheus text exposition format (version 0.0.4): what
//! `alignfs stat --prometheus` prints for node_exporter's textfile collector.
//!
//! Every sample carries the volume's `uuid` and `profile`, so one collector directory
//! can hold the files of several volumes. Lifetime counters end in `_total`, sizes are
//! in bytes and times in seconds, as the Prometheus naming conventions ask.

use std::fmt::Write;

use alignfs::stats::{Counter, RequestLatency, VolumeReport};

/// The SSD write sizes `Stats::ssd_write` sorts IOs into, as histogram bounds in bytes.
const SSD_WRITE_BUCKETS: [(Counter, f64); 4] = [
    (Counter::ssd_io_le_4k, 4096.0),
    (Counter::ssd_io_le_32k, 32768.0),
    (Counter::ssd_io_le_128k, 131072.0),
    (Counter::ssd_io_le_1m, 1048576.0),
];

/// The report as Prometheus text, ending in a newline.
pub fn render(report: &VolumeReport) -> String {
    let mut out = Exposition {
        text: String::new(),
        labels: format!("uuid=\"{}\",profile=\"{}\"", escape_label(&report.uuid), escape_label(&report.profile)),
    };
    out.info(report);
    out.counters(report);
    out.ssd_write_sizes(report);
    out.usage(report);
    for c in &report.device_counters {
        let name = format!("alignfs_device_{}_total", unit_suffixed(&c.name));
        out.family(&name, "counter", &c.meaning);
        out.sample(&name, "", c.value as f64);
    }
    if let Some(daemon) = &report.daemon {
        out.gauge("alignfs_daemon_uptime_seconds", "seconds since the serving daemon started", daemon.uptime_s);
        out.gauge("alignfs_daemon_resident_bytes", "the serving daemon's resident memory", daemon.resident_bytes as f64);
        out.family("alignfs_requests_total", "counter", "requests the daemon served, by kind");
        for (kind, n) in &daemon.requests_by_kind {
            out.sample("alignfs_requests_total", &format!("kind=\"{}\"", escape_label(kind)), *n as f64);
        }
        out.request_durations(&daemon.request_latency);
    }
    out.text
}

struct Exposition {
    text: String,
    /// The labels every sample carries.
    labels: String,
}

impl Exposition {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, extra_labels: &str, value: f64) {
        let comma = if extra_labels.is_empty() { "" } else { "," };
        let _ = writeln!(self.text, "{name}{{{}{comma}{extra_labels}}} {value}", self.labels);
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.family(name, "gauge", help);
        self.sample(name, "", value);
    }

    fn info(&mut self, r: &VolumeReport) {
        self.family("alignfs_volume_info", "gauge", "the volume's format and stores (always 1)");
        let labels = format!(
            "format_version=\"{}\",metadata_store=\"{}\",residue=\"{}\"",
            r.format_version,
            escape_label(&r.metadata_store),
            escape_label(&r.residue_name)
        );
        self.sample("alignfs_volume_info", &labels, 1.0);
        self.gauge("alignfs_recovery_seconds", "time the last open of the volume took to recover its metadata", r.recovery_us as f64 / 1e6);
        if let Some(d) = &r.device_recovery {
            self.gauge(
                "alignfs_device_recovery_seconds",
                "time the memory-semantic SSD took to recover its write log when the volume was last opened",
                d.total_us as f64 / 1e6,
            );
        }
    }

    /// The engine's flow counters, except the SSD write sizes (a histogram below).
    fn counters(&mut self, r: &VolumeReport) {
        for &c in Counter::ALL {
            if c == Counter::ssd_write_ios || SSD_WRITE_BUCKETS.iter().any(|(b, _)| *b == c) || c == Counter::ssd_io_gt_1m {
                continue;
            }
            let name = format!("alignfs_{}_total", c.name());
            self.family(&name, "counter", c.doc());
            self.sample(&name, "", r.counter(c.name()) as f64);
        }
    }

    fn ssd_write_sizes(&mut self, r: &VolumeReport) {
        let name = "alignfs_ssd_write_size_bytes";
        self.family(name, "histogram", "sizes of the SSD write IOs");
        let mut cumulative = 0;
        for (counter, bound) in SSD_WRITE_BUCKETS {
            cumulative += r.counter(counter.name());
            self.sample(&format!("{name}_bucket"), &format!("le=\"{bound}\""), cumulative as f64);
        }
        let ios = r.counter(Counter::ssd_write_ios.name());
        self.sample(&format!("{name}_bucket"), "le=\"+Inf\"", ios as f64);
        self.sample(&format!("{name}_sum"), "", r.counter(Counter::ssd_write_bytes.name()) as f64);
        self.sample(&format!("{name}_count"), "", ios as f64);
    }

    fn request_durations(&mut self, kinds: &[RequestLatency]) {
        if kinds.is_empty() {
            return;
        }
        let name = "alignfs_request_duration_seconds";
        self.family(name, "histogram", "time from a request's arrival at the daemon to its reply, by kind");
        for k in kinds {
            let kind = format!("kind=\"{}\"", escape_label(&k.kind));
            let mut cumulative = 0;
            for (bound, count) in k.bounds_s.iter().zip(&k.counts) {
                cumulative += count;
                self.sample(&format!("{name}_bucket"), &format!("{kind},le=\"{bound}\""), cumulative as f64);
            }
            let total: u64 = k.counts.iter().sum();
            self.sample(&format!("{name}_bucket"), &format!("{kind},le=\"+Inf\""), total as f64);
            self.sample(&format!("{name}_sum"), &kind, k.sum_s);
            self.sample(&format!("{name}_count"), &kind, total as f64);
        }
    }

    fn usage(&mut self, r: &VolumeReport) {
        let u = &r.usage;
        let pages = u.fast_page_bytes as f64;
        let blocks = u.ssd_block_bytes as f64;
        self.gauge("alignfs_fast_tier_used_bytes", "residue tier in use", u.fast_pages_used as f64 * pages);
        self.gauge("alignfs_fast_tier_size_bytes", "residue tier size", u.fast_pages_total as f64 * pages);
        self.gauge("alignfs_fast_tier_peak_bytes", "most of the residue tier in use at once", u.fast_pages_peak as f64 * pages);
        self.gauge("alignfs_ssd_used_bytes", "SSD blocks in use", u.ssd_blocks_used as f64 * blocks);
        self.gauge("alignfs_ssd_promised_bytes", "SSD blocks held for fallocated ranges", u.ssd_blocks_promised as f64 * blocks);
        self.gauge("alignfs_ssd_size_bytes", "SSD blocks in all", u.ssd_blocks_total as f64 * blocks);
        self.gauge("alignfs_metadata_used_bytes", "journal, in-place metadata or KV store in use", u.journal_used_bytes as f64);
        self.gauge(
            "alignfs_metadata_size_bytes",
            "journal or in-place metadata area size (0: a KV store, which grows)",
            u.journal_capacity_bytes as f64,
        );
        self.gauge(
            "alignfs_namespace_ops_waiting",
            "namespace operations applied but not durable yet (scrap: until the next fsync or commit interval)",
            u.namespace_ops_waiting as f64,
        );
        if let Some(cached) = r.ssd_cached_bytes {
            self.gauge("alignfs_ssd_page_cache_bytes", "bytes of the SSD the host's page cache holds (buffered reads)", cached as f64);
        }
        self.gauge("alignfs_checkpoint_used_bytes", "the newest checkpoint's size", u.checkpoint_used_bytes as f64);
        self.gauge("alignfs_checkpoint_size_bytes", "a checkpoint slot's size", u.checkpoint_capacity_bytes as f64);
        self.gauge("alignfs_checkpoint_generation", "the newest checkpoint's generation", u.checkpoint_generation as f64);
        self.gauge("alignfs_ssd_share_ratio", "share of written bytes that went straight to the SSD", r.ssd_share);
    }
}

/// A network front end's report: the volume's, with the server as the daemon part
/// (its uptime since `started` and its requests' service times).
pub fn render_server(
    mut report: VolumeReport,
    front_end: &str,
    started: std::time::Instant,
    request_latency: Vec<RequestLatency>,
) -> String {
    report.daemon = Some(alignfs::stats::DaemonInfo {
        pid: std::process::id(),
        uptime_s: started.elapsed().as_secs_f64(),
        front_end: front_end.into(),
        request_latency,
        resident_bytes: alignfs::stats::resident_bytes(),
        ..Default::default()
    });
    render(&report)
}

/// One unlabelled counter, for a front end's own totals.
pub fn counter(name: &str, help: &str, value: u64) -> String {
    format!("# HELP {name} {}\n# TYPE {name} counter\n{name} {value}\n", escape_help(help))
}

/// A device counter's name with its unit where the name leaves it out.
fn unit_suffixed(name: &str) -> String {
    if name.ends_with("_payload") {
        format!("{name}_bytes")
    } else {
        name.to_string()
    }
}

fn escape_label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

fn escape_help(text: &str) -> String {
    text.replace('\\', "\\\\").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_help_are_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        assert_eq!(escape_help("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"");
    }

    #[test]
    fn every_family_is_declared_once_and_the_histogram_adds_up() {
        let mut report = VolumeReport { uuid: "u\"1".into(), profile: "orch".into(), ..VolumeReport::default() };
        for (name, value) in
            [("ssd_io_le_4k", 3), ("ssd_io_le_1m", 2), ("ssd_io_gt_1m", 1), ("ssd_write_ios", 6), ("ssd_write_bytes", 9_000_000)]
        {
            report.counters.insert(name.into(), value);
        }
        let text = render(&report);
        let mut types: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("# TYPE ")).map(|l| l.split(' ').next().unwrap()).collect();
        let declared = types.len();
        types.sort_unstable();
        types.dedup();
        assert_eq!(types.len(), declared, "a family declared twice");
        assert!(text.contains("alignfs_ssd_write_size_bytes_bucket{uuid=\"u\\\"1\",profile=\"orch\",le=\"4096\"} 3\n"), "{text}");
        assert!(text.contains("le=\"1048576\"} 5\n"), "{text}");
        assert!(text.contains("le=\"+Inf\"} 6\n"), "{text}");
        assert!(text.contains("alignfs_ssd_write_bytes_total{uuid=\"u\\\"1\",profile=\"orch\"} 9000000\n"), "{text}");
        assert!(!text.contains("alignfs_ssd_io_le"), "the size counters are the histogram's buckets");
    }

    #[test]
    fn request_durations_are_a_cumulative_histogram_per_kind() {
        let latency = RequestLatency { kind: "WRITE".into(), bounds_s: vec![1e-5, 1e-4], counts: vec![2, 3, 1], sum_s: 0.5 };
        let daemon = alignfs::stats::DaemonInfo { request_latency: vec![latency], ..Default::default() };
        let report = VolumeReport { uuid: "u".into(), profile: "orch".into(), daemon: Some(daemon), ..VolumeReport::default() };
        let text = render(&report);
        let at = |le: &str| format!("alignfs_request_duration_seconds_bucket{{uuid=\"u\",profile=\"orch\",kind=\"WRITE\",le=\"{le}\"}}");
        assert!(text.contains(&format!("{} 2\n", at("0.00001"))), "{text}");
        assert!(text.contains(&format!("{} 5\n", at("0.0001"))), "{text}");
        assert!(text.contains(&format!("{} 6\n", at("+Inf"))), "{text}");
        assert!(text.contains("alignfs_request_duration_seconds_count{uuid=\"u\",profile=\"orch\",kind=\"WRITE\"} 6\n"), "{text}");
    }
}
