"""`fleetbench asv-offline DIR`: make a published asv dashboard work without internet.

Run after `asv publish` (DIR is asv.conf.json's html_dir, results/html here): the scripts and styles
asv's pages load from CDNs are copied beside them from the copies vendored with fleetbench, and the
pages point at those.  Then serve DIR on loopback (`python3 -m http.server --bind 127.0.0.1 --directory DIR`,
what `make asv-preview` runs; `asv preview` listens on every interface): opened as a file, the pages cannot
fetch their data ("Error fetching content").
"""
from __future__ import annotations

from ..report.asv_offline import OfflineError, make_offline
from . import error, helps


def add_parser(sub) -> None:
    p = sub.add_parser("asv-offline", help="make a published asv dashboard work offline (vendored assets)",
                       **helps(__doc__, """
                           asv publish && fleetbench asv-offline results/html"""))
    p.add_argument("html_dir", metavar="DIR", help="the dashboard `asv publish` wrote (asv.conf.json's html_dir)")
    p.set_defaults(func=main)


def main(args) -> int:
    try:
        pages = make_offline(args.html_dir)
    except (OfflineError, OSError) as exc:
        return error("asv-offline", exc)
    print(f"asv dashboard in {args.html_dir} works offline ({len(pages)} page(s) rewritten to vendor/); "
          f"open it served, not as a file (its pages fetch their data): {preview_command(args.html_dir)}, then "
          f"http://127.0.0.1:{PREVIEW_PORT}/")
    return 0


PREVIEW_PORT = 8080


def preview_command(html_dir: str) -> str:
    """A static server of the dashboard on loopback only (``make asv-preview``)."""
    import shlex

    return f"python3 -m http.server --bind 127.0.0.1 --directory {shlex.quote(html_dir)} {PREVIEW_PORT}"
