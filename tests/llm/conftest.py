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


@pytest.fixture(scope="session")
def fp32_pair(pair):
    """The target with an fp32 draft (RTN with groups of 48, which the int4 kernel cannot hold: de-quantised
    float weights), for checks of cache and mask handling to fp32 round-off: the packed int4 draft rounds its
    activations to bf16, which turns fp32 round-off (different reduction orders of a tree forward and a
    sequential one) into bf16 ulps, ~1e-2 on its probabilities."""
    from gpu.llm.models import ModelPair, build_draft

    return ModelPair(pair.target, build_draft(pair.target, "rtn:4:48"), pair.tokenizer, "rtn:4:48")
