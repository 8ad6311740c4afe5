"""The glossary search widget from Python: typing filters the table."""

from llminfra.course.glossary import GLOSSARY
from llminfra.widgets.glossary import GlossarySearch


def test_typing_filters_the_table():
    w = GlossarySearch()
    assert len(w.matches) == len(GLOSSARY) and f"{len(GLOSSARY)} of {len(GLOSSARY)}" in w.count.value
    w.box.value = "디코드"          # what a learner types
    assert [e.term for e in w.matches] == ["decode", "prefill/decode disaggregation"]
    assert "디코드" in w.table.value and "tensor parallelism" not in w.table.value
    w.box.value = "zzz-no-term"
    assert w.matches == [] and "no term matches" in w.table.value
    assert repr(w.widget).startswith("[interactive widget] Glossary search")
