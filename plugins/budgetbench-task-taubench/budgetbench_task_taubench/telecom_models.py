"""The telecom domain's two databases as pydantic models, field for field as upstream.

``TelecomDB`` is the carrier's side (plans, customers, lines, bills, devices; ``db.toml``),
``TelecomUserDB`` the user's phone and surroundings (``user_db.toml``). Every model forbids
unknown keys, as upstream's ``BaseModelNoExtra``; field order and defaults are upstream's,
because tool outputs dump the models and the environment assertions read them.
"""

# ruff: noqa: UP042 - (str, Enum) as upstream: str() and format() of a member differ from StrEnum's
from __future__ import annotations

import datetime
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field


class NoExtra(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ----------------------------------------------------------------------------- the carrier


class Address(NoExtra):
    street: str
    city: str
    state: str
    zip_code: str


class Plan(NoExtra):
    plan_id: str
    name: str
    data_limit_gb: float
    price_per_month: float
    data_refueling_price_per_gb: float


class DeviceType(str, Enum):
    PHONE = "phone"
    ROUTER = "router"
    TABLET = "tablet"
    WATCH = "watch"
    OTHER = "other"


class Device(NoExtra):
    device_id: str
    device_type: DeviceType
    model: str
    imei: str | None = None
    is_esim_capable: bool
    activated: bool = False
    activation_date: datetime.datetime | None = None
    last_esim_transfer_date: datetime.datetime | None = None


class LineStatus(str, Enum):
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_ACTIVATION = "Pending Activation"
    CLOSED = "Closed"


class Line(NoExtra):
    line_id: str
    phone_number: str
    status: LineStatus = LineStatus.PENDING_ACTIVATION
    plan_id: str
    device_id: str | None = None
    data_used_gb: float = 0.0
    data_refueling_gb: float = 0.0
    roaming_enabled: bool = False
    contract_end_date: datetime.date | None = None
    last_plan_change_date: datetime.date | None = None
    last_sim_replacement_date: datetime.date | None = None
    suspension_start_date: datetime.date | None = None


class LineItem(NoExtra):
    description: str
    amount: float
    date: datetime.date
    item_type: str


class BillStatus(str, Enum):
    DRAFT = "Draft"
    ISSUED = "Issued"
    AWAITING_PAYMENT = "Awaiting Payment"
    PAID = "Paid"
    OVERDUE = "Overdue"
    DISPUTED = "Disputed"


class Bill(NoExtra):
    bill_id: str
    customer_id: str
    period_start: datetime.date
    period_end: datetime.date
    issue_date: datetime.date
    total_due: float
    due_date: datetime.date
    line_items: list[LineItem] = Field(default_factory=list)
    status: BillStatus = BillStatus.DRAFT


class AccountStatus(str, Enum):
    ACTIVE = "Active"
    SUSPENDED = "Suspended"
    PENDING_VERIFICATION = "Pending Verification"
    CLOSED = "Closed"


class PaymentMethodType(str, Enum):
    CREDIT_CARD = "Credit Card"
    DEBIT_CARD = "Debit Card"
    PAYPAL = "PayPal"


class PaymentMethod(NoExtra):
    method_type: PaymentMethodType
    account_number_last_4: str
    expiration_date: str


class Customer(NoExtra):
    customer_id: str
    full_name: str
    date_of_birth: str
    email: str
    phone_number: str
    address: Address
    account_status: AccountStatus = AccountStatus.PENDING_VERIFICATION
    payment_methods: list[PaymentMethod] = Field(default_factory=list)
    line_ids: list[str] = Field(default_factory=list)
    bill_ids: list[str] = Field(default_factory=list)
    created_at: datetime.datetime = datetime.datetime(2025, 1, 1)
    last_extension_date: datetime.date | None = None
    goodwill_credit_used_this_year: float = 0.0


class TelecomDB(NoExtra):
    plans: list[Plan] = Field(default_factory=list)
    customers: list[Customer] = Field(default_factory=list)
    lines: list[Line] = Field(default_factory=list)
    bills: list[Bill] = Field(default_factory=list)
    devices: list[Device] = Field(default_factory=list)


# ----------------------------------------------------------------------------- the user's phone


class SimStatus(str, Enum):
    ACTIVE = "active"
    MISSING = "missing"
    LOCKED_PIN = "locked_pin"
    LOCKED_PUK = "locked_puk"


class NetworkTechnology(str, Enum):
    NONE = "none"
    TWO_G = "2G"
    THREE_G = "3G"
    FOUR_G = "4G"
    FIVE_G = "5G"


class NetworkModePreference(str, Enum):
    FOUR_G_5G_PREFERRED = "4g_5g_preferred"
    FOUR_G_ONLY = "4g_only"
    THREE_G_ONLY = "3g_only"
    TWO_G_ONLY = "2g_only"


class SignalStrength(str, Enum):
    NONE = "none"
    POOR = "poor"
    FAIR = "fair"
    GOOD = "good"
    EXCELLENT = "excellent"


class PerformanceLevel(str, Enum):
    UNKNOWN = "unknown"
    POOR = "poor"
    FAIR = "fair"
    GOOD = "good"
    EXCELLENT = "excellent"


class NetworkStatus(str, Enum):
    CONNECTED = "connected"
    SEARCHING = "searching"
    NO_SERVICE = "no_service"
    EMERGENCY_ONLY = "emergency_only"


class APNNames(str, Enum):
    INTERNET = "internet"
    BROKEN = "broken"


class APNSettings(NoExtra):
    """Represents the configuration for a single Access Point Name (APN)."""

    # the field texts are upstream's: its user tool schema (set_apn_settings) shows them
    apn_name: APNNames = Field(APNNames.INTERNET, description="The name identifier for the APN connection.")
    reset_at_reboot: bool = Field(False, description="Whether the APN settings will be reset at the next reboot.")
    mms_apn: str | None = Field(
        "mms", description="Specific APN name used for MMS traffic, if different from general data."
    )
    mmsc_url: str | None = Field(
        "http://mms.carrier.com/mms/wapenc",
        description="The URL of the Multimedia Messaging Service Center (MMSC). Crucial for MMS.",
    )
    mms_proxy: str | None = Field(
        None, description="The proxy server address required for MMS traffic on some networks."
    )
    mms_port: int | None = Field(None, description="The proxy server port required for MMS traffic on some networks.")


class VpnDetails(NoExtra):
    server_address: str | None = None
    protocol: str | None = None
    server_performance: PerformanceLevel = PerformanceLevel.UNKNOWN


class AppPermissions(NoExtra):
    sms: bool = False
    storage: bool = False
    phone: bool = False
    network: bool = False


class AppStatus(NoExtra):
    app_name: str
    permissions: AppPermissions = Field(default_factory=AppPermissions)


def _default_apps() -> dict[str, AppStatus]:
    return {
        "messaging": AppStatus(app_name="messaging", permissions=AppPermissions(sms=True, storage=True, phone=True)),
        "browser": AppStatus(app_name="browser", permissions=AppPermissions(network=True, storage=True)),
    }


class MockPhoneAttributes(NoExtra):
    sim_card_status: SimStatus = SimStatus.ACTIVE
    sim_card_missing: bool = False
    airplane_mode: bool = False
    network_signal_strength: SignalStrength = SignalStrength.GOOD
    network_technology_connected: NetworkTechnology = NetworkTechnology.FIVE_G
    network_connection_status: NetworkStatus = NetworkStatus.CONNECTED
    battery_level: int = 80
    data_enabled: bool = True
    roaming_enabled: bool = False
    network_mode_preference: NetworkModePreference = NetworkModePreference.FOUR_G_5G_PREFERRED
    active_apn_settings: APNSettings = Field(default_factory=APNSettings)
    wifi_enabled: bool = False
    wifi_connected: bool = False
    wifi_ssid: str | None = None
    wifi_signal_strength: SignalStrength = SignalStrength.NONE
    wifi_calling_enabled: bool = False
    wifi_calling_mms_over_wifi: bool = False
    data_saver_mode: bool = False
    vpn_enabled_setting: bool = False
    vpn_connected: bool = False
    vpn_details: VpnDetails | None = None
    app_statuses: dict[str, AppStatus] = Field(default_factory=_default_apps)


class PaymentRequest(NoExtra):
    bill_id: str
    amount_due: float
    paid: bool = False


def _default_signal() -> dict[NetworkTechnology, SignalStrength]:
    return {
        NetworkTechnology.TWO_G: SignalStrength.POOR,
        NetworkTechnology.THREE_G: SignalStrength.FAIR,
        NetworkTechnology.FOUR_G: SignalStrength.GOOD,
        NetworkTechnology.FIVE_G: SignalStrength.EXCELLENT,
    }


class UserSurroundings(NoExtra):
    name: str | None = None
    phone_number: str | None = None
    is_abroad: bool = False
    roaming_allowed: bool = False
    signal_strength: dict[NetworkTechnology, SignalStrength] = Field(default_factory=_default_signal)
    mobile_data_usage_exceeded: bool = False
    line_active: bool = True
    payment_request: PaymentRequest | None = None


class TelecomUserDB(NoExtra):
    device: MockPhoneAttributes = Field(default_factory=MockPhoneAttributes)
    surroundings: UserSurroundings = Field(default_factory=UserSurroundings)
