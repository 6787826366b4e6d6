"""The asv dashboard offline: asv's pages pointed at vendored copies of the assets they load from CDNs
(`fleetbench asv-offline`).  The static checks run in `make test`; the browser check (a published
dashboard loaded in headless Chromium with every other host unreachable) in `make test-slow`."""
from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil

import pytest

from suite.cli.main import main
from suite.report.asv_offline import ASSETS, VENDOR, OfflineError, external_assets, make_offline


def _asv_www() -> str:
    import asv

    return os.path.join(os.path.dirname(asv.__file__), "www")


@pytest.fixture
def published(tmp_path):
    """asv's own page files, as `asv publish` copies them into html_dir."""
    html = tmp_path / "html"
    shutil.copytree(_asv_www(), html)
    return html


def test_every_cdn_asset_of_asvs_pages_is_vendored_and_the_pages_load_nothing_from_elsewhere(published, capsys):
    before = (published / "index.html").read_text()
    assert set(external_assets(before)) == set(ASSETS), "asv's CDN assets changed: update ASSETS and vendor/asv"
    assert main(["asv-offline", str(published)]) == 0
    assert "works offline" in capsys.readouterr().out
    for page in published.glob("*.html"):
        html = page.read_text()
        assert external_assets(html) == [], page
        refs = re.findall(r"<script\b[^>]*?\bsrc=[\"']([^\"']+)[\"']", html) + re.findall(
            r"<link\b[^>]*?rel=[\"']stylesheet[\"'][^>]*?href=[\"']([^\"']+)[\"']", html)
        assert refs or page.name != "index.html"
        for ref in refs:
            assert (published / ref).is_file(), f"{page.name} loads {ref}, which is not there"
    assert "integrity=" not in (published / "index.html").read_text()  # dropped with the CDN address


def test_vendored_files_are_the_ones_asv_pins_where_it_gives_a_hash():
    """Subresource Integrity hashes from asv's page: where npm's file is the one the CDN serves, it must match."""
    html = open(os.path.join(_asv_www(), "index.html")).read()
    checked = 0
    for url, rel in ASSETS.items():
        m = re.search(re.escape(url) + r"\"[^>]*integrity=\"(sha\d+)-([^\"]+)\"", html)
        assert m, url
        if url.endswith(".min.js") and not rel.endswith(".min.js") or "stupidtable" in url:
            continue  # flot unminified (npm has no .min), stupidtable 1.1.3 for 1.0.1: see vendor/asv/README.md
        with open(os.path.join(VENDOR, rel), "rb") as fh:
            digest = base64.b64encode(hashlib.new(m.group(1), fh.read()).digest()).decode()
        assert digest == m.group(2), (url, rel)
        checked += 1
    assert checked == 5, checked  # jquery, orderBars, md5, bootstrap js and css


def test_a_page_still_loading_from_another_host_is_an_error_naming_it(published, capsys):
    page = published / "extra.html"
    page.write_text('<html><script src="https://cdn.example.org/x.js"></script>'
                    '<a href="https://github.com/airspeed-velocity/asv/">a link is fine</a></html>')
    with pytest.raises(OfflineError, match=r"extra.html: https://cdn.example.org/x.js"):
        make_offline(str(published))
    assert main(["asv-offline", str(published.parent / "nothing")]) == 2
    assert "no index.html" in capsys.readouterr().err
