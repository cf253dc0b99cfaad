//! `alignfs stat`'s table: the volume, the daemon serving it, its metadata and its
//! counters.

use alignfs::stats::{Counter, VolumeReport};

fn percent(used: u64, total: u64) -> f64 {
    if total == 0 {
        0.0
    } else {
        100.0 * used as f64 / total as f64
    }
}

/// `bytes` in the largest binary unit that keeps it at 1 or more, e.g. "3.0 MiB".
fn bytes(bytes: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < units.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}

pub fn print_report(r: &VolumeReport) {
    let meta = if r.metadata_store == "in place" { ", metadata in place" } else { "" };
    println!("volume {} (profile {}, format version {}{meta})", r.uuid, r.profile, r.format_version);
    if let Some(d) = &r.daemon {
        print_daemon(d);
    }
    println!("  fast tier: {}\n  SSD:       {}", r.fast_device, r.ssd_device);
    let residue = &r.residue_name;
    let page = r.usage.fast_page_bytes;
    println!(
        "  {residue}: {} of {} pages used ({:.1}%, {} of {}), at most {} at once",
        r.usage.fast_pages_used,
        r.usage.fast_pages_total,
        percent(r.usage.fast_pages_used, r.usage.fast_pages_total),
        bytes(r.usage.fast_pages_used * page),
        bytes(r.usage.fast_pages_total * page),
        r.usage.fast_pages_peak
    );
    println!(
        "  SSD:       {} of {} blocks used ({:.1}%){}",
        r.usage.ssd_blocks_used,
        r.usage.ssd_blocks_total,
        percent(r.usage.ssd_blocks_used, r.usage.ssd_blocks_total),
        match r.usage.ssd_blocks_promised {
            0 => String::new(),
            held => format!(", {held} more held for fallocated ranges"),
        }
    );
    if let Some(cached) = r.ssd_cached_bytes {
        // The kernel's copy of SSD blocks that buffered reads went through: memory the
        // volume uses beside its residue tier.
        println!("  SSD cache: {} of the SSD in the host's page cache", bytes(cached));
    }
    print_metadata(r);
    println!("  share of written bytes that went straight to the SSD: {:.1}%", 100.0 * r.ssd_share);
    print_counters(r);
}

/// What the daemon serving a mounted volume reports of itself.
fn print_daemon(d: &alignfs::stats::DaemonInfo) {
    println!("  mounted:   {} by pid {}, up {:.0} s", d.mountpoint, d.pid, d.uptime_s);
    if d.resident_bytes > 0 {
        println!("  memory:    {} resident", bytes(d.resident_bytes));
    }
    if !d.front_end.is_empty() {
        println!("  front end: {}", d.front_end);
    }
    if !d.transport.is_empty() {
        println!(
            "  transport: {}; {} requests through io_uring, {} through /dev/fuse",
            d.transport, d.io_uring_requests, d.dev_fuse_requests
        );
    }
    if !d.requests_by_kind.is_empty() {
        let kinds: Vec<String> = d.requests_by_kind.iter().map(|(kind, n)| format!("{kind} {n}")).collect();
        println!("  requests:  {}", kinds.join(", "));
    }
}

/// Where the metadata lives, how full it is, and what opening the volume replayed.
fn print_metadata(r: &VolumeReport) {
    if r.metadata_store == "KV store" {
        println!("  KV store:  {} on disk", bytesize::ByteSize(r.usage.journal_used_bytes));
        println!("  open:      KV records loaded in {:.3} ms", r.recovery_us as f64 / 1000.0);
    } else if r.metadata_store == "in place" {
        // A full area refuses new files and data (ENOSPC); deletes still go through.
        println!(
            "  metadata:  {} of {} of 64-byte lines used, in place ({:.1}%)",
            bytesize::ByteSize(r.usage.journal_used_bytes),
            bytesize::ByteSize(r.usage.journal_capacity_bytes),
            percent(r.usage.journal_used_bytes, r.usage.journal_capacity_bytes),
        );
        println!(
            "  open:      in-place metadata read in {:.3} ms{}",
            r.recovery_us as f64 / 1000.0,
            if r.records_replayed > 0 { " (a block-only commit was replayed from the redo area)" } else { "" }
        );
        if let Some(d) = &r.device_recovery {
            println!("  device:    {d}");
        }
    } else {
        println!(
            "  journal:   {} of {} used{}",
            bytesize::ByteSize(r.usage.journal_used_bytes),
            bytesize::ByteSize(r.usage.journal_capacity_bytes),
            match r.usage.namespace_ops_waiting {
                0 => String::new(),
                n => format!("; {n} namespace operations wait for the next fsync or commit interval"),
            }
        );
        // All metadata must fit one checkpoint slot; a full one refuses new data (ENOSPC).
        println!(
            "  checkpoint: {} of {} used ({:.1}%), generation {}",
            bytesize::ByteSize(r.usage.checkpoint_used_bytes),
            bytesize::ByteSize(r.usage.checkpoint_capacity_bytes),
            percent(r.usage.checkpoint_used_bytes, r.usage.checkpoint_capacity_bytes),
            r.usage.checkpoint_generation
        );
        println!(
            "  open:      {} journal records replayed in {:.3} ms{}",
            r.records_replayed,
            r.recovery_us as f64 / 1000.0,
            if r.torn_tail_dropped { " (a torn, unacknowledged tail record was dropped)" } else { "" }
        );
    }
}

/// The engine's counters, and the device's where it has its own.
fn print_counters(r: &VolumeReport) {
    let kv_store = r.metadata_store == "KV store";
    // Offline, a KV store's counters are those saved at its last clean close.
    println!("counters (lifetime{}):", if kv_store { ", as of the last clean close when offline" } else { "" });
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING).set_header(["counter", "value", "meaning"]);
    for &c in Counter::ALL {
        table.add_row([c.name().to_string(), r.counter(c.name()).to_string(), c.doc().to_string()]);
    }
    println!("{table}");
    if !r.device_counters.is_empty() {
        println!("device counters (since the device was opened):");
        let mut table = comfy_table::Table::new();
        table.load_preset(comfy_table::presets::NOTHING).set_header(["counter", "value", "meaning"]);
        for c in &r.device_counters {
            table.add_row([c.name.clone(), c.value.to_string(), c.meaning.clone()]);
        }
        println!("{table}");
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn sizes_read_in_the_largest_unit() {
        assert_eq!(super::bytes(0), "0 B");
        assert_eq!(super::bytes(1023), "1023 B");
        assert_eq!(super::bytes(3 << 20), "3.0 MiB");
        assert_eq!(super::bytes(4 << 30), "4.0 GiB");
    }
}
