#!/usr/bin/env python3
"""Turns `cargo bench -p epp-promtext --bench parse` output (stdin) into the
Markdown table in docs/BENCHMARKS.md: median throughput in MB/s (10^6 B/s)
per page and parser, plus the ratios the targets are stated in."""
import os
import re
import sys

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures")

UNIT = {"B/s": 1e-6, "KiB/s": 1024 / 1e6, "MiB/s": 1024**2 / 1e6, "GiB/s": 1024**3 / 1e6}
COLS = [
    ("memchr newline scan (floor)", "memchr `\\n` floor"),
    ("epp-promtext full parse with labels", "**ours, full + labels**"),
    ("epp-promtext selective (core metrics)", "**ours, selective**"),
    ("epp-promtext families (allocates)", "ours, families"),
    ("prom_text_format_parser", "prom_text_format_parser"),
    ("prometheus-exposition-format-rs", "prometheus-exposition-format-rs"),
    ("prometheus-parse (colon-free copy)", "prometheus-parse (colon-free copy)"),
    ("prometheus-parse (drops colon names)", "prometheus-parse (drops colon names)"),
]

rows, order, name = {}, [], None
for line in sys.stdin:
    m = re.match(r"^(\S+\.txt)/(.+?)\s*$", line)
    if m:
        name = m.groups()
        continue
    m = re.search(r"thrpt:\s+\[\S+ \S+ (\S+) (\S+) ", line)
    if m and name and "%" not in line:
        page, bench = name
        if page not in rows:
            rows[page] = {}
            order.append(page)
        rows[page][bench] = float(m.group(1)) * UNIT[m.group(2)]
        name = None

def fmt(v):
    return f"{v / 1000:.1f} GB/s" if v >= 1000 else f"{v:.0f} MB/s"

print("| page (size) | " + " | ".join(c for _, c in COLS) + " | full ÷ prom_text_format_parser |")
print("|---" * (len(COLS) + 2) + "|")
for page in order:
    r = rows[page]
    cells = [fmt(r[k]) if k in r else "—" for k, _ in COLS]
    peer = r.get("prom_text_format_parser", 0)
    ratio = f"{r['epp-promtext full parse with labels'] / peer:.1f}×" if peer else "—"
    size = os.path.getsize(os.path.join(FIXTURES, page))
    size = f"{size / 1e6:.2f} MB" if size >= 1e6 else f"{size / 1e3:.0f} KB"
    print(f"| {page} ({size}) | " + " | ".join(cells) + f" | {ratio} |")
