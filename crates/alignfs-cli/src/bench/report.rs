//! The table `alignfs bench` prints.

use super::cells::CellResult;
use super::counters::MIGRATIONS;

pub(super) fn print_report(results: &[CellResult]) {
    let find = |w: &str, d: bool, s: &str| results.iter().find(|r| r.workload == w && r.durable == d && r.system == s);
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::UTF8_BORDERS_ONLY);
    table.set_header(["workload", "sync", "system", "MiB/s", "mean µs", "p99 µs", "ops", "÷ plain", "÷ limit", "to SSD", "rmw", "migr."]);
    for r in results {
        let ratio = |other: &str| {
            find(&r.workload, r.durable, other).filter(|o| o.mib_s > 0.0).map_or("".into(), |o| format!("{:.2}", r.mib_s / o.mib_s))
        };
        let counters = r.counters.as_ref();
        let get = |k: &str| counters.and_then(|c| c.get(k)).and_then(|v| v.as_f64()).unwrap_or(0.0);
        let (share, rmw, migr) = match counters {
            Some(_) => (
                format!("{:.0}%", 100.0 * get("ssd_share")),
                format!("{}", get("fg_rmw_reads")),
                format!("{}", MIGRATIONS.iter().map(|k| get(k)).sum::<f64>()),
            ),
            None => Default::default(),
        };
        let is_volume = r.system != "plain" && r.system != "limit";
        table.add_row([
            r.workload.clone(),
            if r.workload.starts_with("read") {
                "-".into()
            } else if r.durable {
                "fsync".into()
            } else {
                "end".into()
            },
            r.system.clone(),
            format!("{:.1}", r.mib_s),
            format!("{:.1}", r.mean_us),
            format!("{:.1}", r.p99_us),
            r.ops.to_string(),
            if is_volume { ratio("plain") } else { String::new() },
            if is_volume { ratio("limit") } else { String::new() },
            share,
            rmw,
            migr,
        ]);
    }
    println!("{table}");
    println!("÷ plain / ÷ limit: a volume's MiB/s over the plain file's / the device limit's in the same run.");
    println!("to SSD: share of written bytes that went straight to the SSD; rmw: foreground read-modify-writes; migr.: blocks migrated.");
}
