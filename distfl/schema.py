"""Old import path of `distfl.config.schema` (the config's dataclasses), kept for code that imports it:
every public name of that module, whatever sections it grows."""
from distfl.config import schema as _schema

globals().update({name: value for name, value in vars(_schema).items() if not name.startswith("_")})
