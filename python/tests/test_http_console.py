"""The web console (`GET /_sluice/console`) in a real headless Chromium
(Debian's chromium and chromedriver, driven by Selenium): it loads without
console errors, the demo runs from clicks, and the numbers it shows are the
API's."""

import json
import shutil
import time
import urllib.request

import pytest
from conftest import SluiceServe, run_cli


from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import Select, WebDriverWait


def post(url, path, body):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def get(url, path):
    with urllib.request.urlopen(url + path, timeout=60) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def papers_server(tmp_path_factory, sluice_bin):
    dev = tmp_path_factory.mktemp("console") / "papers.dev"
    run_cli(sluice_bin, "kv", "--device", str(dev), "format", "--create-mib", "256")
    run_cli(sluice_bin, "papers", "--device", str(dev), "generate", "--papers", "3000", "--seed", "7")
    server = SluiceServe(sluice_bin, dev)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    assert shutil.which("chromium") and shutil.which("chromedriver"), "scripts/setup installs chromium and chromium-driver"
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium")
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def text(driver, element_id):
    return driver.find_element(By.ID, element_id).text


def test_the_demo_runs_from_clicks_and_shows_the_api_numbers(papers_server, browser):
    url = papers_server.url
    browser.get(url + "/_sluice/console")
    wait = WebDriverWait(browser, 60)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "venue")).options) > 0)
    wait.until(lambda d: len(Select(d.find_element(By.ID, "year")).options) > 0)
    venues = [o.get_attribute("value") for o in Select(browser.find_element(By.ID, "venue")).options]
    want_venues = [r["venue"] for r in post(url, "/_sluice/query", {"keyspace": "papers", "aggregate": "count(*)", "group_by": "venue"})["rows"]]
    assert venues == want_venues
    Select(browser.find_element(By.ID, "venue")).select_by_value(venues[1])
    wait.until(lambda d: d.find_element(By.ID, "run").is_enabled())
    year_select = Select(browser.find_element(By.ID, "year"))
    wait.until(lambda d: len(Select(d.find_element(By.ID, "year")).options) > 0)
    year = int(year_select.options[0].get_attribute("value"))
    browser.find_element(By.ID, "run").click()
    wait.until(lambda d: text(d, "status") == "done")
    want = post(url, "/_sluice/demo", {"venue": venues[1], "year": year})
    assert int(text(browser, "candidates")) == want["candidates"] > 0
    assert int(text(browser, "graph-vertices")) == want["graph"]["vertices"]
    assert int(text(browser, "graph-edges")) == want["graph"]["edges"]
    if want["central"]:
        assert int(text(browser, "central-id")) == want["central"]["id"]
        assert text(browser, "central-title") == want["central"]["paper"]["title"]
    shown = [li.get_attribute("data-id") for li in browser.find_elements(By.CSS_SELECTOR, "#same-venue-year li")]
    assert shown == [str(p["id"]) for p in want["same_venue_year"]]
    # The same data, handed over: the byte counts do not depend on timing.
    assert int(text(browser, "engine-bytes")) == want["engine"]["bytes_handed_over"]
    assert int(text(browser, "block-bytes")) == want["block_stack"]["bytes_handed_over"]
    assert len(browser.find_elements(By.CSS_SELECTOR, "#chart rect")) == 2


def test_the_live_panel_refreshes_with_the_api_figures(papers_server, browser):
    url = papers_server.url
    browser.get(url + "/_sluice/console")
    wait = WebDriverWait(browser, 30)
    wait.until(lambda d: int(d.find_element(By.ID, "updated").get_attribute("data-refreshes") or 0) >= 3)
    stats = get(url, "/_sluice/stats")
    # Nothing writes meanwhile: the log's marks and device counts stand still.
    assert int(text(browser, "wal-durable")) == stats["store"]["wal"]["last_durable"]
    assert int(text(browser, "wal-written")) == stats["store"]["wal"]["last_written"]
    assert int(text(browser, "debt")) == stats["store"]["compaction_debt_bytes"]
    assert float(text(browser, "http-rps")) > 0
    assert text(browser, "resp-rps") != "off"
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == []
