"""Write the trainer settings shared by every arm of an experiment (run by Snakemake's `script:`).

Each training job reads this file (`pods-bench train --config`) and adds its arm's and seed's
settings with `--set key=value`.
"""

import yaml

from pods_bench.io import atomic_write_text

snakemake = globals()["snakemake"]  # injected by Snakemake
text = yaml.safe_dump(snakemake.params.settings, sort_keys=False)
atomic_write_text(snakemake.output[0], text)
with open(snakemake.log[0], "w", encoding="utf-8") as log:
    log.write(f"wrote {snakemake.output[0]}\n")
