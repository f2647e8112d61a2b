"""A training pipeline whose decode is split between the GPU's hardware decoder and DALI's CPU
threads, no JPEG on the CUDA cores: each image goes to the CPU decoder with probability
`cpu_share` (a DALI conditional), the rest to the mixed decoder at `hw_decoder_load` 1.0. The mixed
decoder has no such split of its own: what the hardware decoder leaves goes to nvJPEG's CUDA
decoder. sweep.py's `split*` variants build it in place of the trainer's pipeline.
"""

from nvidia.dali import ops, types

import pipelines


class SplitDecodePipeline(pipelines.ClassifyTrainPipeline):
    def __init__(self, *args, cpu_share=0.4, **kwargs):
        super().__init__(*args, **kwargs)
        crop = dict(
            random_area=list(pipelines.RANDOM_AREA),
            random_aspect_ratio=list(pipelines.RANDOM_ASPECT_RATIO),
            num_attempts=pipelines.CROP_ATTEMPTS,
        )
        if self.decoder_device == "mixed":
            self.decode = ops.decoders.ImageRandomCrop(
                device="mixed",
                output_type=types.RGB,
                **crop,
                **{**self.decoder_args, "hw_decoder_load": 1.0},
            )
        self.decode_cpu = ops.decoders.ImageRandomCrop(
            device="cpu", output_type=types.RGB, adjust_orientation=False, **crop
        )
        self.on_cpu = ops.random.CoinFlip(probability=cpu_share, dtype=types.BOOL)
        self.define_with_conditionals()

    def decoded(self, jpegs):
        if self.on_cpu():
            images = self.decode_cpu(jpegs)
            if self.device == "gpu":
                images = images.gpu()
        else:
            images = self.decode(jpegs)
        return images
