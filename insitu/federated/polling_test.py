from itertools import islice

from insitu.federated.polling import backoff


def test_doubles_from_the_first_pause_up_to_the_longest() -> None:
    assert list(islice(backoff(0.5), 6)) == [0.05, 0.1, 0.2, 0.4, 0.5, 0.5]


def test_a_longest_below_the_first_pause_is_the_pause() -> None:
    assert list(islice(backoff(0.01), 3)) == [0.01, 0.01, 0.01]
