"""One real model pair per test session (SmolLM2-135M target, 4-bit RTN draft)."""
import pytest


@pytest.fixture(scope="session")
def pair():
    from gpu.llm.models import load_pair

    return load_pair("rtn:4:128")


@pytest.fixture(scope="session")
def prompt_ids(pair):
    from gpu.llm.prompts import Prompt, encode_prompt

    return encode_prompt(pair.tokenizer, Prompt("test", "test", "Name three colours of the sea."))
