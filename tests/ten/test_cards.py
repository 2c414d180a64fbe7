"""ten.cards: a card found by the name CUDA gives it, as the GPU suite looks it up."""

from ten.cards import CARDS, card_named


def test_a_card_is_found_by_the_name_cuda_reports_for_it():
    assert card_named("NVIDIA H100 80GB HBM3") is CARDS["H100"]
    assert card_named("NVIDIA L40S\n") is CARDS["L40S"]  # as nvidia-smi may print it
    assert all(card_named(card.cuda_name) is card for card in CARDS.values())  # one each


def test_a_mig_slice_or_an_unlisted_card_is_none():
    # a slice's share of the card's bandwidth is not known: no datasheet figure for it
    assert card_named("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None
    assert card_named("NVIDIA GeForce RTX 4090") is None
