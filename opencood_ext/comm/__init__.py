"""What crosses the network between agents: the message wire format
(:mod:`.wire`), channel effects (:mod:`.channel`: pose noise, latency, loss) and
the one transmission path every fusion method uses (:mod:`.messages`)."""
from .channel import ChannelConfig, ChannelEffects, apply_channel, parse_pose_noise
from .messages import Acceptance, Delivery, Messages, transmit
from .wire import HEADER_SIZE, Message, MessageError, check_pose, decode, encode, message_nbytes, receive_all

__all__ = ["Message", "MessageError", "encode", "decode", "receive_all", "check_pose", "message_nbytes",
           "HEADER_SIZE", "ChannelEffects", "ChannelConfig", "apply_channel", "parse_pose_noise", "Messages",
           "Acceptance", "Delivery", "transmit"]
