"""tierfs.statview - the statistics of a tierfs mount as text: the table of
`tierfsctl stats` (and tierfs-stat), and the Prometheus text format.

Keys the daemon does not report (an older or newer tierfs) are shown as "-";
keys this module does not know are ignored.
"""

import errno
import json
import os
import time

XATTR = "user.tierfs.stats"

class StatError(Exception):
    """A message for stderr; the program exits 1."""


# ---------------------------------------------------------------- reading

def _mount_of(path):
    """(mount point, fstype) of the mount holding `path`, from mountinfo."""
    try:
        real = os.path.realpath(path)
        best = ("", "")
        with open("/proc/self/mountinfo") as f:
            for line in f:
                fields = line.split()
                if " - " not in line or len(fields) < 5:
                    continue
                mp = _unescape(fields[4])
                fstype = line.split(" - ", 1)[1].split()[0]
                inside = real == mp or real.startswith(mp.rstrip("/") + "/")
                if inside and len(mp) >= len(best[0]):
                    best = (mp, fstype)
        return best
    except OSError:
        return ("", "")


def _unescape(s):
    out, i = [], 0
    while i < len(s):
        if s[i] == "\\" and i + 3 < len(s) and s[i + 1:i + 4].isdigit():
            out.append(chr(int(s[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def read_stats(mnt, prog="tierfsctl"):
    """The parsed statistics of the tierfs mount holding `mnt` (its mount
    point, or any file or directory on it); StatError with a message naming
    `prog` otherwise."""
    if not os.path.lexists(mnt):
        raise StatError(f"{prog}: {mnt}: No such file or directory")
    mp, fstype = _mount_of(mnt)
    root = mp if mp and fstype.endswith("tierfs") else mnt
    try:
        raw = os.getxattr(root, XATTR)
    except OSError as e:
        if e.errno in (errno.ENODATA, errno.ENOTSUP, errno.EOPNOTSUPP):
            raise StatError(f"{prog}: {mnt} is not a tierfs mount") from None
        raise StatError(f"{prog}: {mnt}: {os.strerror(e.errno)}") from None
    try:
        stats = json.loads(raw.decode("utf-8", errors="replace"))
    except ValueError as e:
        raise StatError(f"{prog}: {mnt}: unreadable statistics ({e})") from None
    if not isinstance(stats, dict):
        raise StatError(f"{prog}: {mnt}: unreadable statistics (not a JSON object)")
    return stats


# ---------------------------------------------------------------- formatting

def num(v):
    """A number from the JSON, or None (missing, or not a number)."""
    if isinstance(v, bool):
        return None
    return v if isinstance(v, (int, float)) else None


def human(n, suffix=""):
    """1536 -> '1.5 KiB'; None -> '-'."""
    n = num(n)
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n:.0f} B{suffix}"
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        n /= 1024.0
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.1f} {unit}{suffix}"
    return "-"   # not reached


def count(v):
    v = num(v)
    return "-" if v is None else f"{v:.0f}"


def pct(part, whole):
    part, whole = num(part), num(whole)
    if part is None or whole is None or whole <= 0:
        return "-"
    return f"{100.0 * part / whole:.1f}%"


def sub(d, key):
    v = d.get(key) if isinstance(d, dict) else None
    return v if isinstance(v, dict) else {}


def tiers_of(stats):
    tiers = sub(stats, "tiers")
    return [(name, t if isinstance(t, dict) else {}) for name, t in tiers.items()]


def total_reads(stats):
    """All read requests the daemon saw: hits, late reads and misses."""
    total, seen = 0, False
    for _, t in tiers_of(stats):
        for k in ("hits", "late", "misses"):
            v = num(t.get(k))
            if v is not None:
                total += v
                seen = True
    return total if seen else None


def tier_rows(stats):
    header = ["tier", "capacity", "used", "used%", "frags", "gaps", "hits",
              "late", "misses", "hit%", "evictions", "policy", "notes"]
    rows = [header]
    reads = total_reads(stats)
    for name, t in tiers_of(stats):
        cap = t.get("capacity")
        notes = []
        usable = num(t.get("usable"))
        if usable is not None and num(cap) is not None and usable != cap:
            notes.append(f"usable {human(usable)}")
        if "mapped" in t:
            notes.append(f"mapped {human(t.get('mapped'))}")
        if "pinned" in t:
            pinned = t.get("pinned")
            notes.append(f"pinned {human(pinned)}" if num(pinned) is not None
                         else f"pinned {'yes' if pinned else 'no'}")
        touched = num(stats.get("host_touched"))
        if name == "host" and touched is not None and num(cap) is not None \
                and touched < cap:
            notes.append(f"touched {pct(touched, cap)}")
        if num(t.get("evicted_bytes")):
            notes.append(f"evicted {human(t.get('evicted_bytes'))}")
        if num(t.get("evicted_queued")):        # still wanted by the restore queue
            notes.append(f"{count(t.get('evicted_queued'))} evicted while queued")
        if num(t.get("bytes_to_host")):
            note = f"to host {human(t.get('bytes_to_host'))}"
            if num(t.get("to_host_bandwidth")):
                note += f" at {human(t.get('to_host_bandwidth'), '/s')}"
            notes.append(note)
        policy = t.get("policy")
        rows.append([name, human(cap), human(t.get("used")), pct(t.get("used"), cap),
                     count(t.get("fragments")), count(t.get("gaps")),
                     count(t.get("hits")), count(t.get("late")), count(t.get("misses")),
                     pct(t.get("hits"), reads), count(t.get("evictions")),
                     policy if isinstance(policy, str) else "-", ", ".join(notes)])
    return rows


def table(rows):
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    left = {0, 11, 12}                       # tier, policy, notes
    out = []
    for r in rows:
        cells = [c.ljust(w) if i in left else c.rjust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        out.append("  ".join(cells).rstrip())
    return out


def ssd_line(stats):
    s = sub(stats, "ssd")
    if not s:
        return "ssd       -"
    files = num(s.get("files_flushed"))
    wt_files = num(s.get("files_written_through"))
    line = ("ssd       flushed {} ({} files), backlog {}, running {}, "
            "bandwidth {}, errors {}, written-through {} ({} files)").format(
        human(s.get("bytes_flushed")), count(files), human(s.get("flush_backlog")),
        count(s.get("flushes_running")), human(s.get("flush_bandwidth"), "/s"),
        count(s.get("flush_errors")), human(s.get("bytes_written_through")),
        count(wt_files))
    t = s.get("seconds")
    total = num(t.get("total")) if isinstance(t, dict) else None
    if total:
        # where the flushes spent their time: the rest is writing the data
        parts = [(k, num(t.get(k))) for k in ("sync", "clone", "commit")]
        line += ", time {:.2f} s ({})".format(total, ", ".join(
            f"{k} {100 * v / total:.0f}%" for k, v in parts if v is not None))
    return line


def dedup_line(stats):
    d = sub(stats, "dedup")
    if not d:
        return "dedup     -"
    if d.get("on") is False:
        return "dedup     off"
    line = ("dedup     flushed {}: written {}, cloned {}; files {} incremental, "
            "{} by chunks, {} whole").format(
        human(d.get("bytes_logical")), human(d.get("bytes_written")),
        human(d.get("bytes_cloned")), count(d.get("files_incremental")),
        count(d.get("files_dedup")), count(d.get("files_full")))
    if num(d.get("chunks_hashed")):
        line += ", chunks {} hashed / {} found, index {}".format(
            count(d.get("chunks_hashed")), count(d.get("chunks_found")),
            human(d.get("index_bytes")))
    return line


def journal_line(stats):
    """Small changes made durable as journal records (-o journal_pct)."""
    jn = sub(stats, "journal")
    if not jn:
        return None
    if jn.get("on") is False:
        return "journal   off"
    line = ("journal   {} records / {} appended, {} syncs, {} retired, {} live").format(
        count(jn.get("records_appended")), human(jn.get("bytes_appended")),
        count(jn.get("syncs")), count(jn.get("records_retired")),
        count(jn.get("records_live")))
    if num(jn.get("records_replayed")):
        line += ", {} replayed at mount".format(count(jn.get("records_replayed")))
    return line


def persist_line(stats):
    p = sub(stats, "persist")
    if not p:
        return None
    line = ("persist   {}: {} files / {} persisted, backlog {} files / {}, "
            "{} errors, {}/s").format(
        p.get("dir", "-"), count(p.get("files_persisted")), human(p.get("bytes_persisted")),
        count(p.get("backlog_files")), human(p.get("backlog_bytes")),
        count(p.get("errors")), human(p.get("bandwidth")))
    if num(p.get("files_fetched")):
        line += ", fetched {} files / {}".format(count(p.get("files_fetched")),
                                                 human(p.get("bytes_fetched")))
    if num(p.get("pruned")):
        line += ", {} pruned (keep {})".format(count(p.get("pruned")), p.get("keep"))
    if num(p.get("failed")):
        line += ", {} given up".format(count(p.get("failed")))
    if num(p.get("refused")):
        line += ", {} links refused".format(count(p.get("refused")))
    if p.get("state") == "retrying":
        line += " (retrying: {})".format(p.get("last_error", ""))
    elif p.get("state") == "not answering":
        line += " (DIR not answering)"
    return line


def gpus_line(stats):
    """With a GPU cache over several GPUs (-o gpu=0:1): each GPU's part."""
    devs = sub(sub(stats, "tiers"), "gpu").get("devices")
    if not isinstance(devs, list) or not devs:
        return None
    parts = []
    for d in devs:
        if not isinstance(d, dict):
            continue
        parts.append("GPU {}: {} of {} ({})".format(
            d.get("device_id", "?"), human(d.get("used")), human(d.get("size")),
            pct(num(d.get("used")) or 0, num(d.get("size")) or 0)))
    return "gpus      " + ", ".join(parts) if parts else None


def balance_line(stats):
    """With several GPUs: where checkpoints went (-o balance)."""
    b = sub(sub(stats, "tiers"), "gpu").get("balance")
    if not isinstance(b, dict):
        return None
    return ("balance   {}: {} in their GPU, {} to peers ({} across two GPUs, {} on the peer), "
            "{} to host memory ({})".format(
                b.get("policy", "?"), num(b.get("own")) or 0, num(b.get("to_peer")) or 0,
                num(b.get("split")) or 0, human(b.get("to_peer_bytes")),
                num(b.get("to_host")) or 0, human(b.get("to_host_bytes"))))


def prefetch_line(stats):
    p = sub(stats, "prefetch")
    if not p:
        return "prefetch  -"
    state = p.get("state")
    queue = count(p.get("queue"))
    if num(p.get("unbound")):                  # entries whose file does not exist yet
        queue += f" ({count(p.get('unbound'))} without a file yet)"
    line = ("prefetch  state {}, queue {}, prefetched {} files / {}, "
            "distance {}").format(
        state if isinstance(state, str) else "-", queue,
        count(p.get("files_prefetched")), human(p.get("bytes_prefetched")),
        count(p.get("distance")))
    if num(p.get("files_to_gpu")):             # host -> GPU promotions
        line += (f", to the GPU {count(p.get('files_to_gpu'))} files / "
                 f"{human(p.get('bytes_to_gpu'))}")
    if "consumed" in p:
        line += f", consumed {count(p.get('consumed'))}"
    return line


def reads_line(stats):
    reads = total_reads(stats)
    if reads is None:
        return "reads     -"
    hits = sum(num(t.get("hits")) or 0 for _, t in tiers_of(stats))
    late = sum(num(t.get("late")) or 0 for _, t in tiers_of(stats))
    line = f"reads     {reads:.0f} requests, {pct(hits, reads)} from a cache tier"
    if late:
        line += f", {pct(late, reads)} late (waited for a prefetch)"
    return line


def rates_line(prev, cur, dt):
    """Per-second rates between two samples (watch mode)."""
    if prev is None or dt <= 0:
        return "rates     -"

    def delta(get):
        a, b = get(prev), get(cur)
        return None if a is None or b is None else max(b - a, 0) / dt

    def ssd(k):
        return lambda s: num(sub(s, "ssd").get(k))

    def pf(k):
        return lambda s: num(sub(s, "prefetch").get(k))

    reads = delta(total_reads)
    flushed = delta(ssd("bytes_flushed"))
    prefetched = delta(pf("bytes_prefetched"))
    return "rates     reads {}/s, flushed {}, prefetched {}".format(
        "-" if reads is None else f"{reads:.0f}", human(flushed, "/s"),
        human(prefetched, "/s"))


def render(mnt, stats, prev=None, dt=0.0, watch=False):
    lines = [f"tierfs {mnt}" + (time.strftime("   %H:%M:%S") if watch else ""), ""]
    if tiers_of(stats):
        lines += table(tier_rows(stats))
    else:
        lines.append("(no cache tiers reported)")
    if gpus_line(stats):
        lines.append(gpus_line(stats))
    if balance_line(stats):
        lines.append(balance_line(stats))
    lines += ["", ssd_line(stats), dedup_line(stats)]
    if journal_line(stats):
        lines.append(journal_line(stats))
    if persist_line(stats):
        lines.append(persist_line(stats))
    lines += [prefetch_line(stats), reads_line(stats)]
    if watch:
        lines.append(rates_line(prev, stats, dt))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- Prometheus

# Keys that only grow (Prometheus counters); every other number is a gauge.
COUNTERS = {"hits", "late", "misses", "evictions", "evicted_bytes", "evicted_queued",
            "bytes_to_host", "bytes_flushed", "files_flushed", "flush_errors",
            "bytes_written_through", "files_written_through", "files_prefetched",
            "bytes_prefetched", "files_to_gpu", "bytes_to_gpu", "consumed",
            "records_appended", "bytes_appended", "syncs", "records_retired", "resets",
            "records_replayed", "append_seconds", "sync_seconds"}


# "# HELP" text per section and key (tierfs-hints(7), STATISTICS); keys not
# listed get a generic line.
HELP = {
    "tier": {
        "capacity": "Size of the cache tier's buffer in bytes.",
        "usable": "Bytes of the tier that may receive copies (a GPU cache is mapped "
                  "piece by piece).",
        "used": "Bytes held by cached copies.",
        "fragments": "Entries of the tier's allocation table (copies and gaps).",
        "gaps": "Free gaps in the tier's allocation table.",
        "hits": "Read requests served from this tier at once.",
        "late": "Read requests served from this tier after waiting for a prefetch.",
        "misses": "Read requests that no cache tier could serve.",
        "evictions": "Copies evicted to make room.",
        "evicted_bytes": "Bytes of the copies evicted to make room.",
        "evicted_queued": "Evicted copies of files still in the restore queue.",
        "mapped": "Bytes of the GPU cache mapped so far.",
        "fully_mapped": "1 once the GPU cache is fully mapped.",
        "device_id": "CUDA device ordinal of the GPU cache (the first one).",
        "bytes_to_host": "Bytes copied from the GPU cache into the host cache.",
        "to_host_bandwidth": "GPU to host copy rate in bytes per second.",
        "touched": "Bytes of the host cache faulted in so far.",
        "pinned": "1 once the host cache is registered with the GPU driver.",
    },
    "ssd": {
        "bytes_flushed": "Bytes flushed to the backing directory.",
        "files_flushed": "Files flushed to the backing directory.",
        "flush_errors": "Failed flushes (each is retried).",
        "flush_backlog": "Bytes waiting for or being flushed.",
        "flushes_running": "Flushes in progress.",
        "flush_queued": "Files waiting for a flusher (or a failed flush's retry).",
        "flush_done_bytes": "Bytes the running flushes have written or cloned so far.",
        "flush_aging": "Small files whose flush waits for flush_age.",
        "flush_bandwidth": "Measured flush rate in bytes per second.",
        "bytes_written_through": "Bytes written to the SSD directly (no cache room).",
        "files_written_through": "Files written to the SSD directly (no cache room).",
    },
    "journal": {
        "on": "1 while the journal of small changes (-o journal_pct) is open.",
        "records_appended": "Journal records appended (changes and their retirements).",
        "bytes_appended": "Bytes appended to the journal, record headers included.",
        "syncs": "Journal fdatasyncs (group commits).",
        "records_retired": "Journal records retired: their change is in its file.",
        "records_live": "Journal records not retired yet.",
        "resets": "Times the journal file was emptied.",
        "records_replayed": "Journal records of the previous daemon applied at mount.",
        "append_seconds": "Seconds spent writing journal records.",
        "sync_seconds": "Seconds spent in the journal's fdatasyncs.",
    },
    "prefetch": {
        "queue": "Entries in the restore queue.",
        "unbound": "Restore queue entries naming files that do not exist yet.",
        "files_prefetched": "Files read from the SSD into the host tier ahead of reads.",
        "bytes_prefetched": "Bytes read from the SSD into the host tier ahead of reads.",
        "distance": "Entries at the head of the restore queue already cached.",
        "files_to_gpu": "Files copied on from the host tier into the GPU tier.",
        "bytes_to_gpu": "Bytes copied on from the host tier into the GPU tier.",
        "consumed": "Restore queue entries consumed.",
        "running": "1 while prefetching is started, 0 when stopped.",
    },
}


def _help(section, key):
    text = HELP.get(section, {}).get(key)
    if text is None:
        what = "cache tier" if section == "tier" else section
        text = f"tierfs {what} statistic {key} (see tierfs-hints(7), STATISTICS)."
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _label(v):
    return str(v).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _value(v):
    if isinstance(v, bool):
        return 1 if v else 0
    return num(v)


def prometheus(mnt, stats):
    """The statistics in the Prometheus text exposition format (version
    0.0.4): tierfs_tier_KEY{mount,tier}, tierfs_ssd_KEY{mount},
    tierfs_journal_KEY{mount}, tierfs_prefetch_KEY{mount}; counters end in _total; each family has a
    "# HELP" line, then its "# TYPE" line, then its samples.  Booleans are 0/1;
    prefetch's state is tierfs_prefetch_running; other strings are left
    out."""
    series = {}             # metric name -> (type, help, [(labels, value)])

    def put(section, key, labels, v):
        v = _value(v)
        if v is None:
            return
        name = f"tierfs_{section}_{key}"
        kind = "counter" if key in COUNTERS else "gauge"
        if kind == "counter":
            name += "_total"
        series.setdefault(name, (kind, _help(section, key), []))[2].append((labels, v))

    m = {"mount": mnt}
    for tname, t in tiers_of(stats):
        for k, v in t.items():
            put("tier", k, dict(m, tier=tname), v)
    for section in ("ssd", "journal", "prefetch"):
        for k, v in sub(stats, section).items():
            put(section, k, m, v)
    state = sub(stats, "prefetch").get("state")
    if isinstance(state, str):
        put("prefetch", "running", m, state == "start")
    out = []
    for name in sorted(series):
        kind, text, samples = series[name]
        out.append(f"# HELP {name} {text}")
        out.append(f"# TYPE {name} {kind}")
        for labels, v in samples:
            lab = ",".join(f'{k}="{_label(x)}"' for k, x in labels.items())
            out.append(f"{name}{{{lab}}} {v:.17g}" if isinstance(v, float)
                       else f"{name}{{{lab}}} {v}")
    return "\n".join(out) + "\n"
