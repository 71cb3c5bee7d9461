"""The embedded testbed: small base models built deterministically on this machine."""

from pathlib import Path

# The presets `es-llm testbed --size` selects: one YAML each under presets/.
SIZES = tuple(sorted(p.stem for p in (Path(__file__).parent / "presets").glob("*.yaml")))
