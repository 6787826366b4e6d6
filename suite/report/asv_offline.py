"""The asv dashboard without internet: vendored assets beside the published pages.

asv 0.6's pages load jQuery, flot, stupidtable, blueimp-md5 and Bootstrap from CDNs; offline (a GPU
cluster's head node, a CI artifact opened later) the dashboard shows only asv's "Can not determine
continental origin of swallow".  :func:`make_offline` copies the files vendored in
``suite/report/vendor/asv`` (see its README: versions, licences, hashes) into ``DIR/vendor`` and points
every page at them.  A page that still loads a script or style from elsewhere is an error naming the
page and the address (a newer asv adding a CDN asset is caught, not silently half offline).
"""
from __future__ import annotations

import os
import re
import stat

from ..outputs import OutputDir

__all__ = ["ASSETS", "VENDOR", "make_offline", "external_assets", "OfflineError"]

VENDOR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vendor", "asv")

# CDN address (as asv 0.6's index.html names it) -> the vendored file, relative to VENDOR
ASSETS = {
    "https://code.jquery.com/jquery-3.3.1.min.js": "jquery.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.min.js": "jquery.flot.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.time.min.js": "jquery.flot.time.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.selection.min.js": "jquery.flot.selection.js",
    "https://cdnjs.cloudflare.com/ajax/libs/flot/0.8.3/jquery.flot.categories.min.js": "jquery.flot.categories.js",
    "https://cdn.jsdelivr.net/npm/flot-orderbars@1.0.0/js/jquery.flot.orderBars.js": "jquery.flot.orderBars.js",
    "https://cdnjs.cloudflare.com/ajax/libs/stupidtable/1.0.1/stupidtable.min.js": "stupidtable.min.js",
    "https://cdnjs.cloudflare.com/ajax/libs/blueimp-md5/2.19.0/js/md5.min.js": "md5.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/js/bootstrap.min.js": "bootstrap/js/bootstrap.min.js",
    "https://cdn.jsdelivr.net/npm/bootstrap@3.1.1/dist/css/bootstrap.min.css": "bootstrap/css/bootstrap.min.css",
}

# a <script src=…> or <link href=…> tag: the whole tag and its address
_TAG = re.compile(r"<(script|link)\b[^>]*?\b(?:src|href)\s*=\s*[\"']([^\"']+)[\"'][^>]*>", re.IGNORECASE)
_SRI = re.compile(r"\s+(?:integrity|crossorigin|referrerpolicy)\s*=\s*[\"'][^\"']*[\"']", re.IGNORECASE)


class OfflineError(ValueError):
    """A page still loads an asset from another host."""


def external_assets(html: str) -> list[str]:
    """Addresses of scripts and styles a page loads from another host (links to other pages are fine)."""
    out = []
    for found in _TAG.finditer(html):
        tag, url = found.group(0), found.group(2)
        if found.group(1).lower() == "link" and "stylesheet" not in tag.lower() and "icon" not in tag.lower():
            continue
        if re.match(r"^(?:[a-z][a-z0-9+.-]*:)?//", url, re.IGNORECASE):
            out.append(url)
    return out


def _rewrite(html: str) -> str:
    def local(found: re.Match) -> str:
        url = found.group(2)
        if url not in ASSETS:
            return found.group(0)
        return _SRI.sub("", found.group(0)).replace(url, "vendor/" + ASSETS[url])

    return _TAG.sub(local, html)


MAX_PAGE_BYTES = 64 * 2**20  # an asv page is a few KB; its data lives in other files


def _read_page(out: OutputDir, name: str) -> str | None:
    """The text of the regular file ``name`` in ``out`` (not a link, FIFO, device or oversized file: None)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=out.fd)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_PAGE_BYTES:
            return None
        os.set_blocking(fd, True)
        return fh.read(MAX_PAGE_BYTES).decode("utf-8", errors="replace")


def make_offline(html_dir: str) -> list[str]:
    """Copy the vendored assets into ``html_dir/vendor`` and point every top-level page at them; returns the
    pages rewritten.  An OfflineError names a page that still loads an asset from elsewhere; an OutputError (an
    OSError) a link (or anything else not ours to replace) where a file or folder is written: every write goes
    through :class:`suite.outputs.OutputDir`, so nothing lands outside ``html_dir``."""
    index = os.path.join(html_dir, "index.html")
    if not os.path.isfile(index):
        raise OfflineError(f"{html_dir}: no index.html here (run `asv publish` first; this is its html_dir)")
    with OutputDir(html_dir, create=False) as out:
        for root, dirs, files in os.walk(VENDOR):
            dirs.sort()
            rel = os.path.relpath(root, VENDOR)
            for f in sorted(files):
                if rel == "." and f == "README.md":
                    continue
                out.copy_in(os.path.join(root, f), "/".join(["vendor", *([] if rel == "." else rel.split(os.sep)),
                                                             f]))
        pages, left = [], []
        for name in out.entries():
            if not name.endswith(".html"):
                continue
            html = _read_page(out, name)
            if html is None:  # a link, a FIFO, a device: not a page of asv's
                continue
            new = _rewrite(html)
            if new != html:
                out.write(name, new)
                pages.append(name)
            left += [f"{name}: {url}" for url in external_assets(new)]
    if left:
        raise OfflineError("these pages still load assets from other hosts (add them to "
                           "suite/report/asv_offline.py ASSETS and vendor them): " + "; ".join(left))
    return pages

