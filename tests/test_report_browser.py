"""The analysis's self-contained HTML report in a real browser (Debian's headless Chromium via Selenium,
the fixture of test_mlflow_ui_browser): a user opens report.html from disk, opens the hardest question's
drill-down and sees its chain: the question, the gold answers, the passages with the gold answer marked,
each generation's role and raw output, the vote, and the outcome with its error type, for every cell.
The URL fragment #q-<qid> opens a question, the filter box narrows the list. A screenshot of the open
drill-down goes to test-artifacts/report-drilldown.png for a human to look at."""

from __future__ import annotations

import time

from tests.test_analysis_cli import EXP, build_store, cell
from tests.test_mlflow_ui_browser import ARTIFACTS, WAIT_S, browser  # noqa: F401  (browser is a fixture)


def _report(tmp_path):
    from flows.analyze import run_analysis

    root = tmp_path / "store"
    build_store(root)
    res = run_analysis(root, EXP, eor=False, log_mlflow=False)
    return next(f for f in res.files if f.name == "report.html")


def test_report_drilldown_shows_the_chain_in_chromium(browser, tmp_path):  # noqa: F811
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    report = _report(tmp_path)
    wait = WebDriverWait(browser, WAIT_S)
    browser.get(report.resolve().as_uri())
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "details.q"))
    assert "tiny" in browser.title
    questions = browser.find_elements(By.CSS_SELECTOR, "details.q")
    assert [q.get_attribute("id") for q in questions] == ["q-q3", "q-q1", "q-q2", "q-q4"]  # hardest (q3: 0 right) first

    q3 = browser.find_element(By.ID, "q-q3")
    chain = q3.find_element(By.CSS_SELECTOR, ".chain")
    assert not chain.is_displayed()  # closed until the user opens it
    q3.find_element(By.TAG_NAME, "summary").click()
    wait.until(lambda d: chain.is_displayed())

    def shown(css: str, within=chain) -> list[str]:
        return [e.text for e in within.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()]

    assert shown(".question") == ["question: What is Earth's highest mountain?"]
    assert shown("p.golds") == ["gold answers: Mount Everest | Everest"]
    cells = {s.get_attribute("data-cell"): s for s in chain.find_elements(By.CSS_SELECTOR, "section.cell")}
    assert sorted(cells) == [cell("bm25@1"), cell("none")]

    bm25 = cells[cell("bm25@1")]
    assert shown("li.passage", bm25)[0].endswith("Mount Everest is Earth's highest mountain.")
    assert shown("mark.gold", bm25) == ["Mount Everest"]  # the gold answer marked inside the passage
    mark = bm25.find_element(By.CSS_SELECTOR, "mark.gold")
    assert mark.value_of_css_property("background-color") != bm25.value_of_css_property("background-color")
    assert shown(".gen .role", bm25) == ["answer"]
    assert shown("pre.raw", bm25) == ["Answer: K2"]
    assert shown(".vote", bm25) == ['vote single: candidates ["K2"] scores [1.0] → K2']
    assert shown(".error-type", bm25) == ["hallucination_error"]
    assert "gold in context True" in shown(".outcome", bm25)[0]

    closed_book = cells[cell("none")]
    assert shown(".closed", closed_book) == ["no passages (closed book)"]
    assert shown("pre.raw", closed_book) == ["Answer: Alps"] and shown(".error-type", closed_book) == ["retrieval_failure"]

    # the prompt is folded inside its generation; opening it shows the system prompt and the context
    prompt = bm25.find_element(By.CSS_SELECTOR, "details.prompt")
    assert not prompt.find_element(By.TAG_NAME, "pre").is_displayed()
    prompt.find_element(By.TAG_NAME, "summary").click()
    assert "say unknown if unsure" in prompt.find_element(By.TAG_NAME, "pre").text

    browser.execute_script("arguments[0].scrollIntoView({block: 'start'});", q3)
    time.sleep(0.5)  # let the scroll settle before the picture
    ARTIFACTS.mkdir(exist_ok=True)
    browser.save_screenshot(str(ARTIFACTS / "report-drilldown.png"))

    # other questions stay closed; the URL fragment opens one, the filter box narrows the list
    assert not browser.find_element(By.ID, "q-q2").find_element(By.CSS_SELECTOR, ".chain").is_displayed()
    browser.get(report.resolve().as_uri() + "#q-q2")
    wait.until(lambda d: d.find_element(By.ID, "q-q2").get_attribute("open") is not None)
    q2 = browser.find_element(By.ID, "q-q2")
    assert "Lyon is a city in France." in shown("li.passage", q2)[0]
    assert shown(".error-type", q2) == ["retrieval_failure", "lucky_guess"]
    box = browser.find_element(By.ID, "qfilter")
    box.send_keys("highest mountain")
    wait.until(lambda d: [q.get_attribute("id") for q in d.find_elements(By.CSS_SELECTOR, "details.q") if q.is_displayed()]
               == ["q-q3"])
