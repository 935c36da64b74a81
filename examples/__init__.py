"""The example scripts. Run one as a script (`python examples/quickstart.py`): it imports the shared code beside it,
`helpers`. Code outside this folder (tests, benchmarks, the experiments one folder down) imports the same package as
`examples.helpers`, from the repository root."""
