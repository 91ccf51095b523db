"""The processor for image prompts: transformers' `Gemma4Processor`, for text and images only.

A DiffusionGemma checkpoint names `Gemma4Processor`, which `AutoProcessor` loads when torchvision is installed (its
video processor needs torchvision). `load_processor(path)` returns exactly that when it can, and otherwise
`DiffusionGemmaProcessor`: the same class (a subclass; prompt expansion, image placeholders and `mm_token_type_ids`
are Gemma 4's own code) built from the folder's tokenizer and image processor alone, on the Pillow backend. The model
reads no audio and no video (spec C.11), so it has no video processor or audio feature extractor, and refuses both.
"""

import os

from transformers import AutoProcessor, AutoTokenizer, Gemma4Processor
from transformers.processing_utils import ProcessorMixin


class DiffusionGemmaProcessor(Gemma4Processor):
    """`Gemma4Processor` with only a tokenizer and an image processor (text and images; no audio, no video).

    Args:
        image_processor: a Gemma 4 image processor (`Gemma4ImageProcessorPil` or the torchvision one).
        tokenizer: a tokenizer defining `image_token`, `boi_token`, `eoi_token` (and `boa_token`, `eoa_token`,
            `audio_token`, which Gemma 4's input check reads) as special tokens.
        chat_template: Jinja template of `apply_chat_template`; `{"type": "image"}` parts become the image token.
        image_seq_length: soft tokens per image that the template's image token stands for (the image processor
            decides the real count per image).
    """

    def __init__(self, image_processor, tokenizer, chat_template=None, image_seq_length: int = 280, **kwargs):
        for name in ("image_token", "boi_token", "eoi_token"):
            if getattr(tokenizer, name, None) is None:
                raise ValueError(f"the tokenizer defines no `{name}`: a Gemma 4 tokenizer (special tokens image_token,"
                                 " boi_token, eoi_token) is needed for image prompts")
        self.image_seq_length = image_seq_length
        self.image_token, self.image_token_id = tokenizer.image_token, tokenizer.image_token_id
        self.boi_token, self.eoi_token = tokenizer.boi_token, tokenizer.eoi_token
        self.video_token = self.video_token_id = None
        self.audio_seq_length, self.audio_ms_per_token = 0, 40
        for name in ("audio_token", "audio_token_id", "boa_token", "eoa_token"):
            setattr(self, name, getattr(tokenizer, name, None))
        ProcessorMixin.__init__(self, image_processor=image_processor, tokenizer=tokenizer,
                                chat_template=chat_template, **kwargs)

    def __call__(self, images=None, text=None, videos=None, audio=None, **kwargs):
        """Gemma 4's processing of text and images; `videos` or `audio` are a ValueError (the model reads neither)."""
        given = [name for name, value in (("videos", videos), ("audio", audio)) if value is not None]
        if given:
            raise ValueError(f"DiffusionGemma reads text and images only; got {' and '.join(given)}")
        return super().__call__(images=images, text=text, **kwargs)

    def to_dict(self) -> dict:
        out = super().to_dict()
        for name in ("audio_seq_length", "audio_ms_per_token"):  # no audio: nothing to save
            out.pop(name, None)
        return out


def build_processor(tokenizer, image_processor, **kwargs) -> Gemma4Processor:
    """A `DiffusionGemmaProcessor` from a tokenizer and an image processor (see its Args)."""
    return DiffusionGemmaProcessor(image_processor=image_processor, tokenizer=tokenizer, **kwargs)


def load_processor(path: str, **kwargs) -> Gemma4Processor:
    """The image-and-text processor of checkpoint folder (or Hub id) `path`.

    `AutoProcessor.from_pretrained(path)` (the Gemma 4 processor the checkpoint names) when that loads; otherwise (no
    torchvision for Gemma 4's video processor) a `DiffusionGemmaProcessor` from the folder's tokenizer, image processor
    config (Pillow backend) and processor config.

    Raises:
        OSError: the folder has no tokenizer or image processor config.
    """
    try:
        return AutoProcessor.from_pretrained(path, **kwargs)
    except (ImportError, ValueError, TypeError, AttributeError, OSError) as error:
        first_error = error
    from transformers.models.gemma4.image_processing_pil_gemma4 import Gemma4ImageProcessorPil

    try:
        tokenizer = AutoTokenizer.from_pretrained(path, **kwargs)
        image_processor = Gemma4ImageProcessorPil.from_pretrained(path, **kwargs)
    except OSError as error:
        raise OSError(f"{path} holds no image processor/tokenizer for image prompts ({error}); AutoProcessor said: "
                      f"{first_error}") from None
    config = {}
    local = os.path.join(str(path), "processor_config.json")
    if os.path.isfile(local):
        import json

        with open(local) as f:
            config = json.load(f)
    template = config.get("chat_template") or getattr(tokenizer, "chat_template", None)
    return build_processor(tokenizer, image_processor, chat_template=template,
                           image_seq_length=config.get("image_seq_length", 280))


def is_url(source: str) -> bool:
    return source.startswith(("http://", "https://"))


def load_image(source: str, allow_network: bool = False):
    """An RGB `PIL.Image` from a file path (or, with `allow_network`, an http(s) URL).

    Raises:
        ValueError: a URL without `allow_network`, or one that cannot be downloaded; a file Pillow cannot read as an
            image or refuses as too large (named, with the reason).
        FileNotFoundError: no such file. IsADirectoryError: a folder.
    """
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise ImportError("reading images needs Pillow: pip install 'diffusiongemma[vision]'") from None
    if is_url(source):
        if not allow_network:
            raise ValueError(f"image {source} is a URL: pass --allow-network (or allow_network=True) to download "
                             "it, or save it and pass the file")
        from transformers.image_utils import load_image as fetch

        try:
            return fetch(source).convert("RGB")
        except Image.DecompressionBombError as error:
            raise ValueError(f"image {source} is too large to decode safely ({error})") from None
        except Exception as error:  # noqa: BLE001 - requests/httpx/PIL errors: name the URL
            raise ValueError(f"image {source} could not be downloaded or read ({type(error).__name__}: "
                             f"{error})") from None
    if os.path.isdir(source):
        raise IsADirectoryError(f"image {source} is a folder: pass one image file per --image")
    if not os.path.isfile(source):
        raise FileNotFoundError(f"image file {source} does not exist")
    try:
        with Image.open(source) as image:
            return image.convert("RGB")
    except Image.DecompressionBombError as error:  # Pillow refuses more than twice MAX_IMAGE_PIXELS
        raise ValueError(f"image file {source} is too large to decode safely ({error}); shrink it first") from None
    except MemoryError:
        raise ValueError(f"image file {source} is too large to decode in memory; shrink it first") from None
    except (UnidentifiedImageError, OSError) as error:
        raise ValueError(f"image file {source} could not be read as an image ({error})") from None


def image_prompt_inputs(processor, prompt: str, images: list, chat: bool = False) -> dict:
    """The model inputs for one prompt with `images` (PIL images, in order): input_ids [1, P], attention_mask,
    pixel_values, image_position_ids, mm_token_type_ids.

    With `chat`, the prompt becomes a user message whose image parts come first. Otherwise the prompt text is used as
    it is when it holds one image token per image (`processor.image_token`, placed where each image belongs), and
    the image tokens are put in front of it when it holds none.
    """
    if chat:
        content = [{"type": "image", "image": image} for image in images] + [{"type": "text", "text": prompt}]
        out = processor.apply_chat_template([{"role": "user", "content": content}], add_generation_prompt=True,
                                            tokenize=True, return_dict=True, return_tensors="pt")
    else:
        marks = prompt.count(processor.image_token)
        if marks == 0:
            prompt = processor.image_token * len(images) + prompt
        elif marks != len(images):
            raise ValueError(f"the prompt holds {marks} image tokens ({processor.image_token}) for {len(images)} "
                             "images: place one per image, or none to put the images first")
        out = processor(text=[prompt], images=[images], return_tensors="pt")
    return {k: v for k, v in out.items() if k in ("input_ids", "attention_mask", "pixel_values",
                                                  "image_position_ids", "mm_token_type_ids")}
