"""bench.py with ClassifyTrainPipeline's decode on the CPU: DALI's threads decode the random crop's
window (libjpeg-turbo), the crop is copied to the GPU for the resize and normalize, so no decoding
kernels run beside the model. The same arguments as bench.py; its dali-mixed-* rows use this."""

from nvidia.dali import ops, types

import bench
import pipelines


class CpuDecodeTrainPipeline(pipelines.ClassifyTrainPipeline):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        decode = ops.decoders.ImageRandomCrop(
            device="cpu",
            output_type=types.RGB,
            adjust_orientation=False,
            random_area=list(kwargs.get("random_area", pipelines.RANDOM_AREA)),
            random_aspect_ratio=list(kwargs.get("random_aspect_ratio", pipelines.RANDOM_ASPECT_RATIO)),
            num_attempts=pipelines.CROP_ATTEMPTS,
        )
        self.decode = lambda jpegs: decode(jpegs).gpu()


bench.ClassifyTrainPipeline = CpuDecodeTrainPipeline
bench.main()
