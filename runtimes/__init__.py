"""Running .tflite files: the LiteRT interpreter (`litert`), target profiles and checks
(`targets`), the browser (`web`), microcontrollers (`micro`) and benchmarks (`bench`)."""


def check(path_or_model, target, *, quiet: bool = False):
    """Check a model against a deployment target and print the report; see `runtimes.targets.check`."""
    from runtimes.targets import check as check_target

    return check_target(path_or_model, target, quiet=quiet)
