"""`fleetbench asv-offline DIR`: make a published asv dashboard work without internet.

Run after `asv publish` (DIR is asv.conf.json's html_dir, results/html here): the scripts and styles
asv's pages load from CDNs are copied beside them from the copies vendored with fleetbench, and the
pages point at those.  Then serve DIR (`asv preview`, or any static server); opening the file directly
does not work (the pages fetch their data).
"""
from __future__ import annotations

from ..report.asv_offline import OfflineError, make_offline
from . import error, helps


def add_parser(sub) -> None:
    p = sub.add_parser("asv-offline", help="make a published asv dashboard work offline (vendored assets)",
                       **helps(__doc__, """
                           asv publish && fleetbench asv-offline results/html && asv preview"""))
    p.add_argument("html_dir", metavar="DIR", help="the dashboard `asv publish` wrote (asv.conf.json's html_dir)")
    p.set_defaults(func=main)


def main(args) -> int:
    try:
        pages = make_offline(args.html_dir)
    except (OfflineError, OSError) as exc:
        return error("asv-offline", exc)
    print(f"asv dashboard in {args.html_dir} works offline ({len(pages)} page(s) rewritten to vendor/)")
    return 0
