#!/usr/bin/python3
"""The Grafana dashboard (deploy/grafana/alignfs.json) against what the daemons export:
every panel has a query, and every alignfs_* series a query names is in at least one of
the scrapes given (the mount's, the NBD server's, the S3 gateway's), so no panel stays
empty because of a renamed or missing metric.

usage: dashboard.py DASHBOARD.json SCRAPE.prom...
"""

import json
import re
import sys

from prometheus_client.parser import text_string_to_metric_families


def main():
    dashboard = json.load(open(sys.argv[1]))
    exported = set()
    for path in sys.argv[2:]:
        for family in text_string_to_metric_families(open(path).read()):
            exported.update(sample.name for sample in family.samples)
    queries = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    empty = [panel["title"] for panel in dashboard["panels"] if not panel.get("targets")]
    assert not empty, f"panels without a query: {empty}"
    queries += [v["definition"] for v in dashboard["templating"]["list"] if "definition" in v]
    named = {name for query in queries for name in re.findall(r"\balignfs_[a-z0-9_]+", query)}
    missing = sorted(named - exported)
    assert not missing, f"the dashboard queries series no daemon exports: {missing}"
    print(f"dashboard: {len(dashboard['panels'])} panels, {len(named)} series, all exported")


if __name__ == "__main__":
    main()
